"""Where a framework's step goes, measured the same way in both frameworks: wall-clock timers on the objects every
GRPO step uses, whoever calls them.

- preprocessing: the processor's calls (tokenizing the prompts, resizing and normalizing the images); where a
  framework encodes prompts through the adapter (vlm-grpo), the whole `encode_prompts` call: the chat template, the
  images' normalisation, the prompt cache's keys and joins, and the processor;
- generate: `model.generate()` (the rollout's decoding, with whatever it encodes inside);
- vision encoder: the vision tower's calls outside generate();
- LM forward, no grad: the language model's calls outside generate() with gradients off (old and reference log-probs);
- LM forward, with grad: the same with gradients on (the policy's log-probs);
- LM head: the output projection of those forwards, outside generate() and backward: vlm-grpo's scoring head and
  TRL's chunked log-prob function (each with the log-softmax of the chosen tokens inside), or the head module's own
  calls where a framework makes them (then the log-softmax after it is "other");
- backward: `torch.autograd.backward` (forwards recomputed under gradient checkpointing count here);
- optimizer: the optimizer's step (torch's global step hooks);
- other: the rest of the step (rewards, the loss, logging).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from vlm_grpo.adapters.features import hf_core
from vlm_grpo.adapters.module_groups import group_module
from vlm_grpo.grpo.logprobs.lm_head import ScoringHead

PHASES = ("preprocessing", "generate", "vision encoder", "LM forward, no grad", "LM forward, with grad", "LM head",
          "backward", "optimizer", "other")

_INHERITED = object()  # a wrapped attribute its owner did not hold itself


class PhaseClock:
    """Installed on one framework's adapter and models for its run; `begin_step`/`end_step` around each measured
    step; `summary()` gives each phase's median seconds per step."""

    def __init__(self, adapter, models: list[torch.nn.Module], generating: torch.nn.Module):
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.depth = {"generate": 0, "backward": 0, "language": 0, "preprocessing": 0, "LM head": 0}
        self._undo = []
        self._step_start = None
        self._wrap(generating, "generate", "generate")  # the bound method, or the wrapper of bench --lengths
        self._wrap_processor(adapter.processor)
        self._wrap(adapter, "encode_prompts", "preprocessing")  # the processor's calls inside it count once
        self._wrap(torch.autograd, "backward", "backward")  # Tensor.backward calls it by this name
        self._hook_optimizers()
        # vlm-grpo's head stand-in (any instance); a head inside the language model's module is that module's time
        self.time_head_function(ScoringHead, "forward")
        seen = set()
        for model in models:
            head = hf_core(model).get_output_embeddings()
            if head is not None and id(head) not in seen:
                seen.add(id(head))
                self._time_module(head, "LM head")
            for group, phase in (("vision", "vision encoder"), ("language", None)):
                if group == "vision" and not adapter.reads_images:
                    continue
                module = group_module(adapter.module_layout, model, group, adapter.family)
                if id(module) not in seen:
                    seen.add(id(module))
                    self._time_module(module, phase)

    def time_head_function(self, owner, name: str) -> None:
        """A framework's own head function (one that reads the head's weight without calling its module), timed as
        the LM head."""
        self._wrap(owner, name, "LM head", unless=("generate", "backward", "language"))

    # ------------------------------------------------------------------ steps
    def begin_step(self) -> None:
        self.current = defaultdict(float)
        self._step_start = time.perf_counter()

    def end_step(self) -> None:
        total = time.perf_counter() - self._step_start
        step = {phase: self.current.get(phase, 0.0) for phase in PHASES if phase != "other"}
        step["other"] = max(0.0, total - sum(step.values()))
        self.steps.append(step)
        self._step_start = None

    def summary(self) -> dict[str, float]:
        return {phase: statistics.median(s[phase] for s in self.steps) for phase in PHASES} if self.steps else {}

    def per_step(self, phase: str) -> list[float]:
        """`phase`'s seconds in each measured step, in order."""
        return [s[phase] for s in self.steps]

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    # ------------------------------------------------------------------ timers
    def _add(self, phase: str, seconds: float) -> None:
        if self._step_start is not None:  # only inside a measured step
            self.current[phase] += seconds

    def _timed(self, phase: str, call, *args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self._add(phase, time.perf_counter() - started)

    def _wrap(self, owner, name: str, phase: str, unless: tuple[str, ...] = ()) -> None:
        """`owner.name` timed as `phase`, with the depth of its calls kept (what runs inside it is its time); a
        call made inside one of the phases `unless` names is theirs."""
        call = getattr(owner, name)

        @functools.wraps(call)
        def timed(*args, **kwargs):
            inside = any(self.depth[other] for other in unless)
            self.depth[phase] += 1
            try:
                return call(*args, **kwargs) if inside else self._timed(phase, call, *args, **kwargs)
            finally:
                self.depth[phase] -= 1

        own = vars(owner).get(name, _INHERITED)  # the raw attribute (a classmethod stays one after close())
        setattr(owner, name, timed)
        self._undo.append(lambda: delattr(owner, name) if own is _INHERITED else setattr(owner, name, own))

    def _wrap_processor(self, processor) -> None:
        # a call looks __call__ up on the class: wrap the class's, timing this processor's calls only
        cls, original = type(processor), type(processor).__call__
        clock = self

        @functools.wraps(original)
        def timed_call(this, *args, **kwargs):
            if this is not processor or clock.depth["generate"] or clock.depth["preprocessing"]:
                return original(this, *args, **kwargs)
            return clock._timed("preprocessing", original, this, *args, **kwargs)

        cls.__call__ = timed_call
        self._undo.append(lambda: setattr(cls, "__call__", original))

    def _hook_optimizers(self) -> None:
        started: list[float] = []
        pre = register_optimizer_step_pre_hook(lambda *_: started.append(time.perf_counter()))
        post = register_optimizer_step_post_hook(
            lambda *_: self._add("optimizer", time.perf_counter() - started.pop()) if started else None)
        self._undo += [pre.remove, post.remove]

    def _time_module(self, module: torch.nn.Module, phase: str | None) -> None:
        """`phase`, or for the language model one of the two LM-forward phases by the gradient mode; calls inside
        generate() or backward are theirs."""
        started: list[float | None] = []

        nests = {None: "language", "LM head": "LM head"}.get(phase)  # the phases whose calls nest others

        def before(*_):
            inside = self.depth["generate"] or self.depth["backward"] or self.depth["language"] or self.depth["LM head"]
            started.append(None if inside else time.perf_counter())
            if nests:
                self.depth[nests] += 1  # a tower a family runs inside its language model counts there

        def after(*_):
            if nests:
                self.depth[nests] -= 1
            begun = started.pop() if started else None
            if begun is not None:
                name = phase or ("LM forward, with grad" if torch.is_grad_enabled() else "LM forward, no grad")
                self._add(name, time.perf_counter() - begun)

        handles = [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        self._undo += [h.remove for h in handles]
