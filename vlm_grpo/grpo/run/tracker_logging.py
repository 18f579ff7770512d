"""The run's trackers as one part: started once (logging.report_to, their folders claimed in the run directory),
each step's numbers every logging.log_every steps, each logged step's completions table, and the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlm_grpo.grpo.run.completion_tables import log_completion_tables
from vlm_grpo.grpo.run.tracker_setup import TRACKER_PROJECT, claim_tracker_folders, flat_settings


class RunTrackers:
    def __init__(self, accelerator, cfg, run_dir: Path, is_main: bool):
        self.accelerator, self.cfg, self.run_dir, self.is_main = accelerator, cfg, run_dir, is_main
        self.started = False

    def start(self) -> None:
        logging = self.cfg.logging
        if not logging.report_to or self.started:
            return
        flat = {k: str(v) for k, v in flat_settings(self.cfg.to_dict()).items()}
        name = logging.run_name
        kwargs = {"wandb": {"name": name}, "mlflow": {"run_name": name}, "trackio": {"name": name}} if name else {}
        claim_tracker_folders(self.run_dir, logging.report_to, self.is_main)
        self.accelerator.init_trackers(TRACKER_PROJECT, config=flat, init_kwargs=kwargs)
        self.started = True

    def metrics(self, metrics: dict[str, Any], step: int) -> None:
        if self.started and (step % self.cfg.logging.log_every == 0 or step == self.cfg.max_steps):
            # `step` goes as the trackers' step, not as a metric (trackio reserves the name)
            self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"},
                                 step=step)

    def completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """A step's completions (completions.jsonl rows, picture paths included) as a table in each tracker."""
        if self.started and self.is_main:
            log_completion_tables(self.accelerator.trackers, step, rows, self.run_dir,
                                  multimodal=self.cfg.logging.log_multimodal)

    def end(self) -> None:
        if self.started:
            self.accelerator.end_training()
