"""`vlm-grpo plot RUN_DIR`: training curves as PNGs next to the run (inspect/plots.py)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="PNG charts of a training run (reward, KL, length, accuracy ...)")
    p.add_argument("run_dir", help="training run directory (holds metrics.jsonl)")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/plots)")
    p.add_argument("--dpi", type=int, default=100)
    p.add_argument("--accuracy-component", default=None,
                   help="reward component meaning 'correct' (default: accuracy or correctness when logged)")
    p.add_argument("--correct-above", type=float, default=0.0,
                   help="a completion counts as correct when that component is above this (default 0)")
    p.add_argument("--length-unit", choices=["words", "chars"], default="words",
                   help="unit of the accuracy-by-length buckets")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.inspect.plots import write_plots

    written = write_plots(
        args.run_dir, args.out, dpi=args.dpi, accuracy_component=args.accuracy_component,
        length_unit=args.length_unit, threshold=args.correct_above,
    )
    for path in written:
        print(path)
    return 0
