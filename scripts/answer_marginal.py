"""The answer marginal of a GRPO run, recomputed from its completions.jsonl: per question type, the share of the
commonest stated answer and the share the commonest right answer holds among the same prompts (what a policy right
on every prompt would show), as the mean of the first, middle and last ten steps. For runs that predate
`guards/right_answer_share` in metrics.jsonl (the run's own config.yaml rebuilds its training samples).

    python scripts/answer_marginal.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from vlm_grpo.experiment.table import monitor_lines, windowed
from vlm_grpo.grpo.data.recipe_source import build_split
from vlm_grpo.grpo.guards.hacking_watch import answer_marginal, answer_row, run_hints
from vlm_grpo.grpo.settings.sources import load_recipe_config


def step_shares(run: Path) -> list[dict]:
    """metrics.jsonl-like rows, one per step of completions.jsonl: the step and its answer-share keys."""
    cfg, recipe = load_recipe_config(run / "config.yaml")
    samples = build_split(recipe, cfg.data, "train", cfg.data.train_size, cfg.seed)
    hints = run_hints(recipe, custom_rewards=bool(cfg.data.rewards))
    by_step: dict[int, list[dict]] = defaultdict(list)
    with (run / "completions.jsonl").open() as lines:
        for line in lines:
            row = json.loads(line)
            by_step[row["step"]].append(answer_row(samples[row["sample_index"]], row["completion"], hints))
    return [{"step": step, **answer_marginal(rows)} for step, rows in sorted(by_step.items())]


def main(runs: list[str]) -> None:
    print("\n".join(monitor_lines({"monitor": {"": {run: windowed(step_shares(Path(run))) for run in runs}}})))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
