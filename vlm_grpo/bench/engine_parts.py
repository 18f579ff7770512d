"""Where a vlm-grpo step with vLLM rollouts spends its time (bench --engine vllm): timers wrapped around the
engine's and the trainer's calls on this one trainer object (instrumentation only: nothing they compute changes).

- engine_start_s: exporting the policy and building vLLM's engine (once, before the warm-up step);
- rollout_s: the trainer's whole rollout (prompt encoding, the policy's image features, the engine's rollout);
- engine_rollout_s: the engine's rollout (vLLM requests built from the samples, generate, results -> Rollout);
- vllm_generate_s: vLLM's own generate (its processor on the prompts and images, scheduling, prefill, decode);
- weight_push_s: the policy's weights pushed into the engine after the update (reload + cache resets);
- nograd_policy_forward_s: the policy's no-grad log-prob forward of the step (the trainer's side of the importance
  ratio, which the transformers engine does not need when num_iterations is 1).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

STEP_PARTS = ("rollout_s", "engine_rollout_s", "vllm_generate_s", "weight_push_s", "nograd_policy_forward_s")


class EngineParts:
    def __init__(self, trainer):
        self.trainer = trainer
        started = time.perf_counter()
        engine = trainer.sampler.open_engine()  # what the first rollout would open, opened here: the warm-up skips it
        self.engine_start_s = time.perf_counter() - started
        self.torch_threads = torch.get_num_threads()  # vLLM's CPU worker binds threads and then holds the count
        self.current: dict[str, float] | None = None
        self.steps: list[dict[str, float]] = []
        engine.rollout = self._timed(engine.rollout, "engine_rollout_s")
        engine.generate = self._timed(engine.generate, "vllm_generate_s")
        engine.load_weights = self._timed(engine.load_weights, "weight_push_s")
        # the step's own call (the guards score through policy_logps, so their forwards are not counted)
        scorer = trainer.scorer
        scorer.sampling_policy_logps = self._timed(scorer.sampling_policy_logps, "nograd_policy_forward_s")

    def _timed(self, call: Callable, part: str) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                if self.current is not None:
                    self.current[part] += time.perf_counter() - started

        return timed

    def begin_step(self) -> None:
        self.current = dict.fromkeys(STEP_PARTS, 0.0)

    def end_step(self) -> None:
        self.current["rollout_s"] = self.trainer.timings["rollout"]
        self.steps.append(self.current)
        self.current = None

    def summary(self) -> dict[str, Any]:
        """Medians over the measured steps, the engine start, and each step's parts."""
        medians = {p: statistics.median(s[p] for s in self.steps) for p in STEP_PARTS} if self.steps else {}
        return {"engine_start_s": self.engine_start_s, **medians, "per_step": self.steps}
