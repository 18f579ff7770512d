"""What a run writes about itself at its end, however it was started (the train and sft commands, GRPOTrainer or
SFTTrainer in Python, an experiment's stage): its charts under RUN_DIR/plots (logging.plot) and RUN_DIR/report.html
(logging.report). The run is trained and saved by then, so a page that cannot be written only warns."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
PAGE_FAULTS = (ValueError, OSError, ImportError)  # an unreadable log, a full disk, matplotlib not installed


def _write_page(what: str, write: Callable[[], str]) -> None:
    try:
        print(write())
    except PAGE_FAULTS as err:
        log.warning("could not write the run's %s: %s", what, err)


def write_run_plots(run_dir: Path) -> None:
    from vlm_grpo.inspect.plots import write_plots

    def charts() -> str:
        written = write_plots(run_dir)
        return f"charts written to {run_dir / 'plots'} ({', '.join(p.name for p in written)})"

    _write_page("plots", charts)


def write_run_report(run_dir: Path) -> None:
    from vlm_grpo.inspect.report import write_report

    _write_page("report", lambda: f"report written to {write_report(run_dir)}")


def run_pages(settings) -> list[Callable[[Path], None]]:
    """The writers a run's logging settings ask for, in the order they run: charts, then the report."""
    return [write_run_plots] * bool(settings.plot) + [write_run_report] * bool(settings.report)
