"""One seed of an experiment: its stages in pipeline order (compose, align, sft, grpo, the arms, eval), each
skipped when it finished and resumed when it stopped (stages.py, arms.py), and run by one command at a time
(stage_lock.py)."""

from __future__ import annotations

from typing import Callable

from vlm_grpo.experiment.arms import run_arm
from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.experiment.stage_lock import stage_held
from vlm_grpo.experiment.stages import run_align, run_compose, run_eval, run_training

RUNNERS = {"compose": run_compose, "align": run_align, "sft": run_training("sft"), "grpo": run_training("grpo")}


def run_experiment(exp: Experiment, seed: int, stages: tuple[str, ...] | None = None, say: Callable[[str], None] = print,
                   test: bool = False) -> None:
    """The `stages` (default: all, exp.stage_names()) of one seed, in pipeline order; `test`: eval also answers the
    test splits."""
    stages = exp.stage_names() if stages is None else stages
    for stage in exp.stage_names():
        if stage not in stages:
            continue
        with stage_held(exp, stage, seed, say):  # another command running this stage: refused, naming it
            if stage == "eval":
                run_eval(exp, seed, say, test=test)
            elif stage in exp.arms:
                run_arm(exp, stage, seed, say)
            else:
                RUNNERS[stage](exp, seed, say)
