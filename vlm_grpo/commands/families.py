"""`vlm-grpo families`: supported families, model types, module groups and presets (the README table);
`--all`: every image-text-to-text model type of transformers with its status (family file, generic, or not
supported and why); `--measure [TYPE ...]`: measure the generic adapter on those types again and record it."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("families", help="supported families, model types, module groups and presets")
    p.add_argument("--all", action="store_true", help="every image-text-to-text model type of transformers and its "
                   "status: family file, generic adapter (measured), or not supported and why")
    p.add_argument("--measure", nargs="*", metavar="TYPE", default=None,
                   help="re-measure the generic adapter (twin, calibration, cache probe, 2 GRPO steps, and the "
                   "contract suite when run from the repository) on TYPEs (none: every type without a family file) "
                   "and record it in adapters/generic/model_types.json")
    p.add_argument("--no-contract", action="store_true", help="with --measure: skip the contract suite")
    p.add_argument("--write", metavar="FILE", default=None,
                   help="write the table into FILE between its `<!-- families-table:start/end -->` markers (with "
                   "--all: `<!-- model-types-table:start/end -->`) instead of printing it")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.adapters.families_table import families_table, missing_extras_note, model_types_table, untested_note

    if args.measure is not None:
        from vlm_grpo.bench.model_types import measure

        measure(args.measure or None, contract=not args.no_contract)
    if not (args.all or args.measure is not None):
        return _emit(families_table(), "families-table", args.write)
    _emit(model_types_table(), "model-types-table", args.write)
    for note in (missing_extras_note(), untested_note()):
        if note:
            print("\n" + note)
    return 0


def _emit(table: str, marker: str, path: str | None) -> int:
    if path is None:
        print(table)
        return 0
    from pathlib import Path

    file = Path(path)
    text = file.read_text()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"vlm-grpo families: error: {path} has no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    file.write_text(head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1])
    print(f"wrote the {marker.replace('-', ' ')} into {path}")
    return 0
