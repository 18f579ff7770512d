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
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.adapters.families_table import families_table, missing_extras_note, model_types_table, untested_note

    if args.measure is not None:
        from vlm_grpo.bench.model_types import measure

        measure(args.measure or None, contract=not args.no_contract)
    if not (args.all or args.measure is not None):
        print(families_table())
        return 0
    print(model_types_table())
    for note in (missing_extras_note(), untested_note()):
        if note:
            print("\n" + note)
    return 0
