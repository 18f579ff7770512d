"""Scoring completions with named, weighted reward functions; each component is kept for logging.

A reward may return None for a completion it does not apply to (TRL's convention): that component is NaN for
it, the weighted total leaves it out (a NaN-ignoring sum, as TRL's nansum), a completion no reward applies to
has a NaN total (advantages give it 0) and logged means are over the values present.

Rewards are called as TRL 1.16 calls them, through the one guarded call site of user code (grpo/user_calls.py: sync
ones in order, async ones awaited together, each within `timeout` when one is set); what they return is checked
(grpo/rewards/values.py): a wrong type, a non-finite or out-of-range score, a string, is a RewardError naming the
reward, the completion and the problem. A reward that raises is a RewardError naming it, its file:line, the
completion, the dataset row and the step; one that calls sys.exit() or raises KeyboardInterrupt always is (whatever
on_error says); one that times out counts as failed.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from typing import Any, Sequence

import torch

from vlm_grpo.grpo.rewards.inputs import RewardInputs
from vlm_grpo.grpo.rewards.values import BadScore, checked_score, checked_weight, score_list, split_reward_spec
from vlm_grpo.grpo.user_calls import UserCodeError, call, settle_all
from vlm_grpo.grpo.user_code import load_object
from vlm_grpo.recipes.base import Reward

log = logging.getLogger(__name__)


def load_reward_function(spec: str):
    """`package.module:function` or `path/to/file.py:function`: only the code the user names is loaded."""
    fn = load_object(spec, "reward function", noun="function")
    if not callable(fn):
        module_name, _, name = spec.rpartition(":")
        raise ValueError(f"reward function {spec!r}: {module_name} has no function {name!r} ({type(fn).__name__})")
    return fn


def run_rewards(recipe, specs: list[str], weights: list[float] | None = None, models: Sequence[str] = (),
                model_options: dict[str, Any] | None = None, required: bool = True) -> list[Reward]:
    """The rewards a run scores with: `data.rewards` when given (it replaces the recipe's), else the recipe's, then
    the reward models (`data.reward_models`, loaded with `model_options`); `weights` (TRL's reward_weights), when
    given, is one weight per reward in that order and replaces theirs. `required=False`: none is fine (SFT)."""
    rewards = parse_reward_specs(specs, explicit_weights=bool(weights)) if specs else [
        Reward(r.name, r.fn, r.weight) for r in recipe.rewards
    ]
    rewards += [model_reward(spec, explicit_weights=bool(weights), **(model_options or {})) for spec in models]
    if not rewards and required:
        raise ValueError(f"No reward source provided: recipe {recipe.name!r} has no rewards of its own: name at least one with "
                         "--reward module:function, --reward file.py:function or --reward-model MODEL")
    return weighed(rewards, weights)


def weighed(rewards: list[Reward], weights: list[float] | None = None) -> list[Reward]:
    """`rewards` with `weights` (one per reward, in order) put in, checked to carry names apart."""
    if weights:
        if len(weights) != len(rewards):
            raise ValueError(f"data.reward_weights has {len(weights)} weights for {len(rewards)} rewards "
                             f"({', '.join(r.name for r in rewards)}): give one per reward, in order")
        for reward, weight in zip(rewards, weights):
            reward.weight = checked_weight(f"data.reward_weights: reward {reward.name!r}", weight)
    for reward in rewards:  # a recipe's or a Python caller's own weight too
        reward.weight = checked_weight(f"reward {reward.name!r}", reward.weight)
    names = [r.name for r in rewards]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two rewards are named {twice[0]!r}: name them apart (name=module:function)")
    return rewards


def _split_spec(spec: str, explicit_weights: bool) -> tuple[str, str, float]:
    """(name or "", target, weight) of `name=target*weight` (name and weight optional)."""
    name, target, weight = split_reward_spec(spec)
    if weight is not None and explicit_weights:
        raise ValueError(f"reward {spec!r} carries a weight and data.reward_weights is set too: give weights one way")
    return name, target, 1.0 if weight is None else weight


def parse_reward_specs(specs: list[str], explicit_weights: bool = False) -> list[Reward]:
    """`name=module:function*weight` entries (name and weight optional)."""
    rewards = []
    for spec in specs:
        name, target, weight = _split_spec(spec, explicit_weights)
        fn = load_reward_function(target)
        rewards.append(Reward(name or getattr(fn, "__name__", target.rpartition(":")[2]), fn, weight))
    return rewards


JUDGE = "judge:"  # a reward model spec's prefix for a VLM judge


def reward_model_kind(target: str, trust_remote_code: bool = False) -> tuple[str, str]:
    """("judge" | "classifier", the model spec): `judge:SPEC` and VLM specs (tiny:, preset:, FAMILY:PATH, a checkpoint
    of a supported family) are judges; a checkpoint whose architecture is `*ForSequenceClassification` a classifier."""
    from vlm_grpo.adapters.registry import class_for_model_type, families

    if target.startswith(JUDGE):
        return "judge", target[len(JUDGE):]
    prefix, colon, _ = target.partition(":")
    if colon and not os.path.exists(target) and (prefix in ("tiny", "preset", "pretrained") or prefix in families()):
        return "judge", target
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(target, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - not found, offline, malformed: all the same to the user
        raise ValueError(f"reward model {target!r}: cannot read its config ({type(err).__name__}: {err})") from None
    if any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
        return "classifier", target
    try:
        judges = class_for_model_type(config.model_type).reads_images  # a judge sees the image it judges
    except ValueError:
        judges = False
    if not judges:
        raise ValueError(f"reward model {target!r}: {config.architectures or config.model_type} is neither a sequence-"
                         "classification model nor a vision-language model of a supported family")
    return "judge", target


def model_reward(spec: str, explicit_weights: bool = False, *, judge_question: str | None = None, device: Any = None,
                 trust_remote_code: bool = False, allow_pickle_weights: bool = False, seed: int = 0) -> Reward:
    """A `--reward-model` entry, `name=MODEL*weight` (name and weight optional), as a loaded Reward."""
    from vlm_grpo.grpo.rewards.judge import DEFAULT_QUESTION, VLMJudge
    from vlm_grpo.grpo.rewards.reward_model import RewardModel

    name, target, weight = _split_spec(spec, explicit_weights)
    kind, model = reward_model_kind(target, trust_remote_code)
    safety = {"trust_remote_code": trust_remote_code, "allow_pickle_weights": allow_pickle_weights}
    if kind == "judge":
        fn = VLMJudge(model, judge_question or DEFAULT_QUESTION, name=name or "judge", device=device, seed=seed, **safety)
    else:  # named as TRL names it: the model's last path part
        fn = RewardModel(model, name=name or model.rstrip("/").rpartition("/")[2], device=device, **safety)
    return Reward(fn.__name__, fn, weight)


class RewardError(UserCodeError):
    """A reward function raised, exited, timed out or returned something unusable; the message names the reward,
    the completion and what was wrong."""

    def __init__(self, message: str, cause: UserCodeError | None = None):
        if cause is None:
            RuntimeError.__init__(self, message)
            self.exited = self.timed_out = False
            self.traceback_text, self.cause = "", None
            self._message = message
        else:
            super().__init__(cause.kind, cause.function, cause.where, cause.what, sample=cause.sample, step=cause.step,
                             exited=cause.exited, timed_out=cause.timed_out, traceback_text=cause.traceback_text,
                             hint=cause.hint, cause=cause.cause, label=cause.label)
            self._message = None

    def line(self) -> str:
        return self._message if getattr(self, "_message", None) else super().line()


def _call_one(reward: Reward, inputs: RewardInputs, timeout: float | None) -> Any:
    return call("reward", reward.fn, via=inputs.call, timeout=timeout, context={"label": reward.name})


def _offending_sample(reward: Reward, inputs: RewardInputs, timeout: float | None) -> tuple[int, UserCodeError | None]:
    """Re-run the reward one completion at a time to find the first one it fails on."""
    for i in range(len(inputs)):
        try:
            _call_one(reward, inputs.one(i), timeout)
        except UserCodeError as err:
            return i, err
    return -1, None


def _format_hint(inputs: RewardInputs, index: int, cause: BaseException | None) -> str:
    """A reward that indexes its completions the other way fails with one of these: say which form it got."""
    if index < 0 or not isinstance(cause, (TypeError, KeyError, IndexError, AttributeError)):
        return ""
    if inputs.conversational and inputs.conversational[index]:
        return ("; completions were chat messages [{'role': 'assistant', 'content': text}] because the row's prompt "
                "is chat messages (TRL's rule)")
    return ("; completions were plain text because the sample's prompt is not TRL chat-message data (TRL's rule: "
            "write the prompt as chat messages to get [{'role': 'assistant', 'content': text}])")


def _completion(inputs: RewardInputs, index: int) -> str:
    return f"completion {index} ({inputs.completions[index][:80]!r})" if index >= 0 else "the batch (no completion alone)"


def _failed(reward: Reward, inputs: RewardInputs, err: UserCodeError, on_error: str, errors: dict[str, int],
            timeout: float | None) -> list[float]:
    """The reward failed on the batch: name it and the completion, or (on_error zero) score the failing ones 0. An
    exit always stops; a timeout is not re-run per completion (each would wait as long); nor is a call that left the
    process broken (grpo/call_contract.py: a closed stdout), which always stops too."""
    broke = err.broke_state
    index, cause = (-1, None) if err.timed_out or broke else _offending_sample(reward, inputs, timeout)
    if index < 0:  # no completion alone reproduces it: the batch's own error is the one to show
        cause = err
    if cause.exited or broke or on_error != "zero":
        raise RewardError("", cause.where_also(sample=_sample(inputs, index), step=_step(inputs), label=reward.name,
                                               hint=_format_hint(inputs, index, cause.cause))) from None
    if err.timed_out:
        errors[reward.name] = errors.get(reward.name, 0) + len(inputs)
        return [0.0] * len(inputs)
    values = []  # each completion alone, so only the ones it fails on get 0
    for i in range(len(inputs)):
        try:
            values.append(_checked(reward, inputs.one(i), _call_one(reward, inputs.one(i), timeout), "raise")[0])
        except UserCodeError as failed:
            if failed.exited:
                raise RewardError("", failed.where_also(sample=_sample(inputs, i), step=_step(inputs),
                                                        label=reward.name)) from None
            values.append(0.0)
            errors[reward.name] = errors.get(reward.name, 0) + 1
    return values


def _sample(inputs: RewardInputs, index: int) -> str:
    row = inputs.rows[index] if inputs.rows is not None and index >= 0 else None
    return _completion(inputs, index) + (f", dataset row {row}" if row is not None else "")


def _step(inputs: RewardInputs) -> int | None:
    return None if inputs.state is None else int(inputs.state.global_step) + 1


def _checked(reward: Reward, inputs: RewardInputs, output: Any, on_error: str, errors: dict[str, int] | None = None,
             ) -> list[float]:
    """The reward's output as floats (NaN where it returned None); a wrong type or value is a RewardError naming it
    (on_error="zero": a bad value scores 0 and is counted)."""
    try:
        items = score_list(output, len(inputs))
    except ValueError as err:
        raise RewardError(f"reward {reward.name!r} {err}") from None
    values = []
    for i, item in enumerate(items):
        try:
            values.append(checked_score(i, item))
        except BadScore as err:
            if on_error != "zero":
                raise RewardError(f"reward {reward.name!r} returned a bad score for {_sample(inputs, i)}: the score "
                                  f"{err}") from None
            values.append(0.0)
            errors[reward.name] = errors.get(reward.name, 0) + 1
    return values


def score(
    rewards: list[Reward],
    completions: list[str] | RewardInputs,
    fields: dict[str, list[Any]] | None = None,
    on_error: str = "raise",
    errors: dict[str, int] | None = None,
    timeout: float | None = None,
    warn_unscored: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total weighted reward [N] and each component's raw scores [N] (NaN where a reward returned None).

    `completions` is a RewardInputs (everything TRL passes a reward) or plain texts with their `fields`.
    on_error="raise": a failing reward raises RewardError naming it and the completion it failed on;
    "zero": those completions score 0 for it, counted per reward in `errors`. `timeout`: seconds a reward may run
    (None: no limit); one that overruns is stopped and counts as failed.
    """
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_reward_error must be raise or zero, not {on_error!r}")
    inputs = completions if isinstance(completions, RewardInputs) else RewardInputs(list(completions), dict(fields or {}))
    components: dict[str, torch.Tensor] = {}
    errors = {} if errors is None else errors
    weighted = []
    # sync rewards in order, async ones awaited together (TRL 1.16)
    outputs = settle_all("reward", [(r.fn, functools.partial(inputs.call, r.fn)) for r in rewards],
                         [{"label": r.name} for r in rewards], timeout=timeout)
    for reward, (ok, output) in zip(rewards, outputs):
        if ok:
            values = _checked(reward, inputs, output, on_error, errors)
        else:
            values = _failed(reward, inputs, output, on_error, errors, timeout)
        scores = torch.tensor(values, dtype=torch.float32)
        components[reward.name] = scores
        weighted.append(reward.weight * scores)
    if not weighted:
        return torch.zeros(len(inputs)), components
    stacked = torch.stack(weighted)
    total = torch.nansum(stacked, dim=0)
    unscored = torch.isnan(stacked).all(dim=0)
    total[unscored] = math.nan  # no reward applies: unscorable, not 0
    if warn_unscored and bool(unscored.any()):
        i = int(unscored.nonzero()[0])
        row = {"prompt": (inputs.prompts or [None] * len(inputs))[i], "completion": inputs.completions[i],
               **{k: v[i] for k, v in inputs.fields.items() if k != "images"}}
        log.warning("All reward functions returned None for the following kwargs: %s (%d of %d completions); such a "
                    "completion gets no advantage. Make at least one reward return a number for it.",
                    repr(row)[:500], int(unscored.sum()), len(inputs))
    return total, components


def nan_mean(values: torch.Tensor) -> float:
    """Mean over the values present (NaN: not applicable); NaN when none is."""
    return torch.nanmean(values.float()).item()


def nan_std(values: torch.Tensor) -> float:
    """Unbiased std over the values present; 0.0 with fewer than two."""
    present = values[~torch.isnan(values)]
    return present.std().item() if present.numel() > 1 else 0.0
