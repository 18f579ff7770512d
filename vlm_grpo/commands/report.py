"""`vlm-grpo report RUN_DIR`: one self-contained HTML page of a run, completions next to their images (inspect/report.py)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


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


def report_hook(run_dir: Path) -> None:
    """What `train`/`sft` wire into a run with `logging.report` (the default): RUN_DIR/report.html; a failure only warns."""
    from vlm_grpo.inspect.report import write_report

    try:
        path = write_report(run_dir)
    except (ValueError, OSError, ImportError) as err:
        log.warning("could not write the run's report: %s", err)
        return
    print(f"report written to {path}")
