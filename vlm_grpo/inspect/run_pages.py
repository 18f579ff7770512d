"""What a run writes about itself at its end, however it was started (the train and sft commands, GRPOTrainer or
SFTTrainer in Python, an experiment's stage): its charts under RUN_DIR/plots (logging.plot) and RUN_DIR/report.html
(logging.report). The run is trained and saved by then, so a page that cannot be written only warns."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
PAGE_FAULTS = (ValueError, OSError, ImportError)  # an unreadable log, a full disk, matplotlib not installed


def write_run_plots(run_dir: Path) -> None:
    from vlm_grpo.inspect.plots import write_plots

    try:
        written = write_plots(run_dir)
    except PAGE_FAULTS as err:
        log.warning("could not write the run's plots: %s", err)
        return
    print(f"charts written to {run_dir / 'plots'} ({', '.join(p.name for p in written)})")


def write_run_report(run_dir: Path) -> None:
    from vlm_grpo.inspect.report import write_report

    try:
        path = write_report(run_dir)
    except PAGE_FAULTS as err:
        log.warning("could not write the run's report: %s", err)
        return
    print(f"report written to {path}")


def run_pages(settings) -> list[Callable[[Path], None]]:
    """The writers a run's logging settings ask for, in the order they run: charts, then the report."""
    return [write_run_plots] * bool(settings.plot) + [write_run_report] * bool(settings.report)
