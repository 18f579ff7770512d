"""A generation in progress, in the run's checkpoints: with steps_per_generation k > 1 one rollout batch feeds k
steps, and a checkpoint after step 1 of those k must let the resumed run train steps 2..k on the same batch. Sampling
it again cannot: the weights that sampled it (and gave its old log-probs) have moved on. So a checkpoint inside a
generation holds its draws as sampled (tokens, text, the engine's log-probs), its old and reference log-probs, the
row order its steps split, and the numbers its steps report; the resumed run replays the draws (rewards and
advantages are taken from them again as the first step took them) and restores the rest, so its weights equal an
uninterrupted run's. Files: generation.safetensors and generation.json, verified by the manifest like the rest.

What cannot be replayed (a tool or rollout_func rollout: its turns and columns are not kept) is said on resume, in
one line: those steps train on the generation sampled again with the resumed weights."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.grpo.checkpoint.run_state import BadRunState
from vlm_grpo.grpo.parts.rollout_source import read_results, result_of, write_results

TENSORS = "generation.safetensors"
INDEX = "generation.json"
LOGPS = ("old_logps", "ref_logps", "sampling_logps", "sampling_ratio")  # as the first step took them


@dataclass
class SavedGeneration:
    index: int
    order: list[int]
    report: dict[str, float]
    engine_metrics: dict[str, float]
    draw_metrics: dict[str, float]
    draws: list  # rollout_source Results, replayed in order
    logps: dict[str, torch.Tensor]


class GenerationInProgress:
    def __init__(self, cfg, draws):
        self.cfg, self.draws = cfg, draws
        self.current = None  # the stage's Generation
        self.trained = 0  # steps completed
        self.saved: SavedGeneration | None = None  # read from the checkpoint resumed from, until replayed
        self.replayable = True

    def track(self, generation, steps_trained: int) -> None:
        self.current, self.trained = generation, steps_trained

    def _inside(self) -> bool:
        k = self.cfg.steps_per_generation
        return k > 1 and self.current is not None and self.trained % k != 0 and self.current.index == self.trained // k

    def take(self, index: int) -> SavedGeneration | None:
        """The saved generation `index`, once (its draws queued for replay): None when none was saved."""
        saved, self.saved = self.saved, None
        if saved is None or saved.index != index:
            return None
        self.draws.replay(saved.draws)
        return saved

    # ---------------------------------------------------------------- in the run's checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {}

    def save_files(self, directory: Path) -> None:
        if not self._inside():
            return
        gen, traj = self.current, self.current.scored.trajectory
        rollouts = [d.sampled.rollout for d in self.draws.generation_draws]
        replayable = all(ro.tool_mask is None and not ro.conversations and not ro.extra_fields for ro in rollouts)
        facts = {"index": gen.index, "order": list(gen.order), "replayable": replayable, "report": gen.report,
                 "engine_metrics": gen.engine_metrics, "draw_metrics": gen.draw_metrics}
        logps = {name: getattr(traj, name) for name in LOGPS if getattr(traj, name) is not None}
        write_results(directory, [result_of(d) for d in self.draws.generation_draws] if replayable else [],
                      TENSORS, INDEX, more=logps, facts=facts)

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        if not (checkpoint / INDEX).is_file():
            return
        draws, logps, facts = read_results(checkpoint, TENSORS, INDEX)
        path = checkpoint / INDEX
        try:
            saved = SavedGeneration(
                index=int(facts["index"]), order=[int(r) for r in facts["order"]],
                report=_numbers(facts["report"]), engine_metrics=_numbers(facts["engine_metrics"]),
                draw_metrics=_numbers(facts["draw_metrics"]), draws=draws, logps=logps)
            replayable = facts["replayable"] is True
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BadRunState(path, "(the file)", f"is not a saved generation ({type(err).__name__}: {err})") from None
        if sorted(saved.order) != list(range(len(saved.order))) or set(logps) - set(LOGPS):
            raise BadRunState(path, "order", "is not an order of the generation's rows, or its tensors are not "
                              "log-probs")
        if not replayable:
            print(f"{checkpoint.name} was saved inside rollout generation {saved.index}, whose tool or rollout_func "
                  "turns are not kept: its remaining steps train on that generation sampled again with the "
                  "resumed weights", file=sys.stderr)
            return
        self.saved = saved


def _numbers(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise TypeError(f"a mapping of numbers, got {type(value).__name__}")
    return {str(k): float(v) for k, v in value.items()}
