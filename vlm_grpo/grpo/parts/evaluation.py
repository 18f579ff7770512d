"""Greedy held-out evaluation of the policy as it is now, on the run's held-out split (built once) or on other
rows; and around a GRPO run (`eval.before_after`): the same held-out samples before the first and after the last
step, written to eval-before.json / eval-after.json and before-after.txt, logged as metrics rows, and kept for the
model card. A resumed run reads its "before" from the run directory instead of evaluating the moved policy again."""

from __future__ import annotations

import functools
import json
from typing import Any

from vlm_grpo.grpo.heldout_eval import evaluate_run, format_report, heldout_metrics, heldout_split, side_by_side
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.checkpoint.store import latest_checkpoint

SIDE_BY_SIDE_SHOWN = 6  # held-out pairs printed at the end of a run


class Evaluation:
    def __init__(self, ctx, data, policy):
        self.ctx, self.cfg, self.data, self.policy = ctx, ctx.cfg, data, policy
        self.reports: dict[str, dict[str, Any]] = {}  # held-out reports by moment (before, after, step N), for the card

    @functools.cached_property
    def heldout_data(self):
        """The held-out samples, built once for every evaluation of the run."""
        return heldout_split(self.data.recipe, self.cfg)

    def evaluate(self, step: int, dataset=None) -> dict[str, Any]:
        """The greedy held-out evaluation at `step` (on the policy's full weights when sharded), on `dataset` when
        given (those rows only; the run's held-out split stays as it was)."""
        rows = self.heldout_data if dataset is None else dataset
        return self.policy.with_full_weights(lambda: evaluate_run(
            self.policy.adapter, self.data.recipe, self.cfg, rewards=self.data.rewards, step=step, dataset=rows))

    def heldout_of(self, eval_dataset: str):
        """The held-out samples of another `data.eval_dataset` value (rows given in Python: their record), as the
        run would build its own; the run's stay as they were."""
        data = self.cfg.data
        given, data.eval_dataset = data.eval_dataset, eval_dataset
        try:
            return heldout_split(self.data.recipe, self.cfg)
        finally:
            data.eval_dataset = given

    # ---------------------------------------------------------------- before and after a run
    def resuming(self) -> bool:
        cfg = self.cfg
        return cfg.resume_from is not None or (cfg.resume and latest_checkpoint(self.ctx.run_dir) is not None)

    def before(self) -> dict[str, Any] | None:
        """The evaluation before the first step: run now, or read back by a resumed run (None: it has none)."""
        if not self.resuming():
            return self.heldout("before", 0)
        path = self.ctx.run_dir / "eval-before.json"
        if path.is_file():  # a resumed run evaluated it the first time
            self.reports["before"] = json.loads(path.read_text())
            return self.reports["before"]
        return None

    def after(self, before: dict[str, Any] | None) -> dict[str, Any]:
        """The evaluation after the last step, and the same samples side by side with `before`."""
        after = self.heldout("after", self.cfg.max_steps)
        if before is not None and self.ctx.is_main:
            self._report_before_after(before, after)
        return after

    def heldout(self, when: str, step: int) -> dict[str, Any]:
        """Greedy evaluation (eval section) written to eval-<when>.json and logged as a metrics row."""
        ctx = self.ctx
        report = self.evaluate(step)
        if ctx.is_main:
            report["model"] = self.cfg.model.init_from or self.cfg.model.name
            report["step"] = step
            safe_files.write_run_file(ctx.run_dir, f"eval-{when}.json", json.dumps(report, indent=2, default=str))
            ctx.log.metrics({"step": step, "stage": f"eval-{when}", **heldout_metrics(report)})
            print(f"\nheld-out evaluation {when} GRPO (step {step}):\n{format_report(report)}")
        self.reports[when] = report
        ctx.trackers.metrics(heldout_metrics(report), step)
        return report

    def _report_before_after(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The same held-out samples answered before and after GRPO: all in the run directory, a few on screen."""
        path = self.ctx.run_dir / "before-after.txt"
        safe_files.write_run_file(self.ctx.run_dir, path.name, side_by_side(before, after) + "\n")
        print(f"\nthe same held-out samples, greedy, before and after GRPO (all {after['size']} in {path}):\n")
        print(side_by_side(before, after, limit=SIDE_BY_SIDE_SHOWN))
        if before["accuracy"] is not None:
            print(
                f"\nheld-out accuracy ({after['size']} {self.cfg.eval.split} samples): "
                f"{before['accuracy']:.1%} before -> {after['accuracy']:.1%} after {self.cfg.max_steps} GRPO steps"
            )
