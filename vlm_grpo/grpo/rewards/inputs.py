"""What a reward function is called with: TRL 1.16's keyword arguments, so rewards written for TRL run unchanged.

TRL's GRPOTrainer calls each reward as `fn(prompts=, completions=, completion_ids=, trainer_state=, log_extra=,
log_metric=, **columns)`; so does this loop:
- `completions`: the text of each completion, or, when the sample's dataset prompt was chat messages,
  `[{"role": "assistant", "content": text}]` (TRL's rule: conversational data, conversational completions).
  The built-in recipes write their prompts themselves; their data is not TRL-format, so their rewards get text.
  With tools (multi-turn rollouts) every completion is the whole conversation after the prompt, as TRL hands it
  over: assistant messages (with `tool_calls`) and tool messages (`{"role": "tool", "name", "content"}`, images
  as `{"type": "image", "image": <PIL>}` parts); `prompts` then hold the environments' reset observations and
  `environments` each rollout's environment instance.
- `prompts`: a TRL-format row's prompt as the dataset wrote it; a conversational one as TRL hands it over, every
  content a list of parts with the row's images filled into its image parts. Built-in recipes: the sample's messages.
- `completion_ids`: each completion's token ids up to and including its first end-of-sequence token.
- `trainer_state`: a `transformers.TrainerState` whose `global_step` is the number of steps done so far.
- `log_extra(column, values)` / `log_metric(name, value)`: collected here, written by the trainer.
- every sample field (the dataset's other columns), one value per completion; for a built-in recipe's samples
  (no dataset image column), their images as `images`.
A function without `**kwargs` gets only the arguments it names (TRL would fail on it; narrow rewards keep working).
Each call gets its own deep copies of what it reads (completions, prompts, ids, columns): a reward that edits them
reaches neither the other rewards nor the logs. Environments are the live instances (their state is the point).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from vlm_grpo.recipes.base import Sample, expand


def collect_fields(samples: list[Sample], times: int) -> dict[str, list[Any]]:
    """Every sample field (the dataset's other columns), one value per completion. Samples a recipe wrote (not TRL
    rows, whose image column is already a field) also give their images as `images`, so a reward that looks (a VLM
    judge) sees them as it would see a TRL dataset's image column."""
    keys = {k for s in samples for k in s.fields}
    fields = {k: expand([s.fields.get(k) for s in samples], times) for k in sorted(keys)}
    if "images" not in fields and all(s.data_prompt is None for s in samples):
        fields["images"] = expand([list(s.images) for s in samples], times)
    return fields


def trainer_state(global_step: int = 0, max_steps: int = 0):
    """The object TRL passes as `trainer_state` (transformers' own class, so attribute names match)."""
    from transformers import TrainerState

    return TrainerState(global_step=global_step, max_steps=max_steps)


def filled_messages(messages: list[dict[str, Any]], images: Sequence[Any], videos: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Copies of `messages` with the images and videos placed into their parts, in order (`{"type": "image", "image":
    img}`, `{"type": "video", "video": clip}`)."""
    pending = {"image": iter(images), "video": iter(videos)}
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [{**p, p["type"]: next(pending[p["type"]], None)} if p.get("type") in pending else dict(p)
                       for p in content]
        out.append({**message, "content": content})
    return out


def reward_prompt(sample: Sample) -> Any:
    if isinstance(sample.data_prompt, list):
        return filled_messages(sample.prompt, sample.images, sample.videos)
    return sample.prompt if sample.data_prompt is None else sample.data_prompt


def _private(value: Any) -> Any:
    """A deep copy for one user call (an object that cannot be copied is handed over as it is)."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - e.g. a handle or a lock in a user's column
        return value


def _accepted(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    """All of `kwargs` when `fn` takes **kwargs (or its signature cannot be read), else only those it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return {k: v for k, v in kwargs.items() if k in names}


@dataclass
class RewardInputs:
    """One batch of completions and everything a reward may read about them (all lists aligned, N long)."""

    completions: list[str]
    fields: dict[str, list[Any]] = field(default_factory=dict)
    prompts: list[Any] | None = None
    completion_ids: list[list[int]] | None = None
    conversational: list[bool] | None = None
    state: Any = None  # a TrainerState; a fresh one (step 0) when None
    extra_columns: dict[str, list[Any]] = field(default_factory=dict)  # from log_extra
    logged_metrics: dict[str, list[float]] = field(default_factory=dict)  # from log_metric
    conversations: list[list[dict]] | None = None  # multi-turn rollouts: each completion's messages (TRL's form)
    environments: list[Any] | None = None  # each rollout's environment instance
    rows: list[int] | None = None  # each completion's dataset row (for messages)

    def __len__(self) -> int:
        return len(self.completions)

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], times: int, completions: list[str], completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, state: Any = None) -> "RewardInputs":
        """The inputs of `samples`' completions, `times` consecutive completions per sample."""
        mask = completion_mask.bool().cpu()
        return cls(
            completions=list(completions),
            fields=collect_fields(list(samples), times),
            prompts=expand([reward_prompt(s) for s in samples], times),
            completion_ids=[row[m].tolist() for row, m in zip(completion_ids.cpu(), mask)],
            conversational=expand([isinstance(s.data_prompt, list) for s in samples], times),
            state=state,
        )

    def with_tools(self, session, conversations: list[list[dict]]) -> "RewardInputs":
        """These inputs for a multi-turn rollout: conversations as completions, the prompts as the tool session
        wrote them (reset observations included, images filled in) and its environments."""
        g = len(self) // len(session.prompts)
        self.conversations, self.environments = conversations, session.environments
        self.prompts = expand([filled_messages(p, imgs) for p, imgs in zip(session.prompts, session.images)], g)
        return self

    def reward_completions(self) -> list[Any]:
        if self.conversations is not None:
            return list(self.conversations)
        flags = self.conversational or [False] * len(self)
        return [[{"role": "assistant", "content": t}] if conv else t for t, conv in zip(self.completions, flags)]

    def call(self, fn: Callable) -> Any:
        kwargs: dict[str, Any] = dict(self.fields)
        kwargs.update(completions=self.reward_completions(), trainer_state=self.state or trainer_state())
        if self.prompts is not None:
            kwargs["prompts"] = self.prompts
        if self.completion_ids is not None:
            kwargs["completion_ids"] = self.completion_ids
        kwargs = {k: _private(v) for k, v in _accepted(fn, kwargs).items()}
        kwargs.update(_accepted(fn, {"log_extra": self.log_extra, "log_metric": self.log_metric}))
        if self.environments is not None:
            kwargs.update(_accepted(fn, {"environments": list(self.environments)}))
        return fn(**kwargs)

    def one(self, i: int) -> "RewardInputs":
        """Completion `i` alone (to find the completion a failing reward breaks on); logs go nowhere."""
        def pick(values):
            return None if values is None else [values[i]]

        return RewardInputs([self.completions[i]], {k: [v[i]] for k, v in self.fields.items()}, pick(self.prompts),
                            pick(self.completion_ids), pick(self.conversational), self.state,
                            conversations=pick(self.conversations), environments=pick(self.environments),
                            rows=pick(self.rows))

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.extra_columns.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.logged_metrics.setdefault(name, []).append(float(value))
