"""`vlm-grpo report RUN_DIR`: one self-contained HTML page of a run, completions next to their images (inspect/report.py)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page of a run: curves, completions with their images")
    p.add_argument("run_dir", help="training run directory (holds metrics.jsonl)")
    p.add_argument("--out", default=None, help="output file (default: RUN_DIR/report.html)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.inspect.report import write_report

    path = write_report(args.run_dir, args.out)
    print(f"report written to {path} ({path.stat().st_size / 1e6:.2f} MB); it opens offline in any browser")
    return 0
