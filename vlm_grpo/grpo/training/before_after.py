"""Held-out evaluation around a run (`eval.before_after`): greedy answers on the same held-out samples before the
first and after the last step, written to eval-before.json / eval-after.json and before-after.txt, logged as
metrics rows, and kept for the model card. A mixin of a stage (GRPO's) over BaseTrainer; a resumed run reads its
"before" from the run directory instead of evaluating the moved policy again."""

from __future__ import annotations

import json
from typing import Any

from vlm_grpo.grpo.evaluate import format_report, heldout_metrics, side_by_side
from vlm_grpo.grpo.run import safe_files
from vlm_grpo.grpo.run.checkpoints import latest_checkpoint

SIDE_BY_SIDE_SHOWN = 6  # held-out pairs printed at the end of a run


class BeforeAfter:
    def _heldout(self, when: str, step: int) -> dict[str, Any]:
        """Greedy evaluation (eval section) written to eval-<when>.json and logged as a metrics row."""
        report = self.evaluate(step)
        if self.is_main:
            report["model"] = self.cfg.model.init_from or self.cfg.model.name
            report["step"] = step
            safe_files.write_run_file(self.run_dir, f"eval-{when}.json", json.dumps(report, indent=2, default=str))
            self.log.metrics({"step": step, "stage": f"eval-{when}", **heldout_metrics(report)})
            print(f"\nheld-out evaluation {when} GRPO (step {step}):\n{format_report(report)}")
        self.heldout[when] = report
        self.trackers.metrics(heldout_metrics(report), step)
        return report

    def train(self) -> list[dict[str, Any]]:
        """The loop; with eval.before_after, a held-out evaluation before the first and after the last step."""
        cfg = self.cfg
        if not cfg.eval.before_after:
            return super().train()
        resuming = cfg.resume_from is not None or (cfg.resume and latest_checkpoint(self.run_dir) is not None)
        self.trackers.start()
        if not resuming:
            before = self._heldout("before", 0)
        elif (self.run_dir / "eval-before.json").is_file():  # a resumed run evaluated it the first time
            before = self.heldout["before"] = json.loads((self.run_dir / "eval-before.json").read_text())
        else:
            before = None
        history = super().train(finish=False)
        if history and history[-1]["step"] == cfg.max_steps:
            after = self._heldout("after", cfg.max_steps)
            if before is not None and self.is_main:
                self._report_before_after(before, after)
            self.run_after_hooks()  # again, now with the after point
            self.finish()
        return history

    def _report_before_after(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The same held-out samples answered before and after GRPO: all in the run directory, a few on screen."""
        path = self.run_dir / "before-after.txt"
        safe_files.write_run_file(self.run_dir, path.name, side_by_side(before, after) + "\n")
        print(f"\nthe same held-out samples, greedy, before and after GRPO (all {after['size']} in {path}):\n")
        print(side_by_side(before, after, limit=SIDE_BY_SIDE_SHOWN))
        if before["accuracy"] is not None:
            print(
                f"\nheld-out accuracy ({after['size']} {self.cfg.eval.split} samples): "
                f"{before['accuracy']:.1%} before -> {after['accuracy']:.1%} after {self.cfg.max_steps} GRPO steps"
            )
