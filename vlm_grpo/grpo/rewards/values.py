"""What a reward function may return, checked: one score per completion, each a finite number of sane size or None
(TRL's "does not apply"). Anything else is named precisely, so a wrong return type does not read as a reward that
raised, and a string "1.0" or a score of 1e300 is not trained on silently.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MAX_ABS_REWARD = 1e6  # larger scores overflow float32 statistics (1e300 is inf) and swamp every other reward
MAX_ABS_WEIGHT = 1e6  # a weight times a score must stay a float32 number too


class BadScore(ValueError):
    """One completion's score is unusable (the caller names the reward and the completion)."""

    def __init__(self, index: int, problem: str):
        super().__init__(problem)
        self.index = index


def _type_name(value: Any) -> str:
    return type(value).__name__


def score_list(values: Any, expected: int) -> list[Any]:
    """The reward's output as a list of `expected` items; a ValueError saying what it was otherwise."""
    if values is None or isinstance(values, (str, bytes, dict, numbers.Number)):
        text = shown(values) if isinstance(values, int) else repr(str(values)[:40])  # a huge int has no str
        what = "None" if values is None else f"a {_type_name(values)} ({text})"
        raise ValueError(f"returned {what} instead of a list of {expected} scores, one per completion (None inside "
                         "the list marks a completion it does not apply to)")
    shape = getattr(values, "shape", None)
    if shape is not None and len(shape) != 1:
        raise ValueError(f"returned a {len(shape)}-D {_type_name(values)} of shape {tuple(shape)}; expected {expected} "
                         "scores in one dimension, one per completion")
    try:
        items = values.tolist() if hasattr(values, "tolist") else list(values)
    except TypeError:
        raise ValueError(f"returned a {_type_name(values)} instead of a list of {expected} scores") from None
    if len(items) != expected:
        raise ValueError(f"returned {len(items)} scores for {expected} completions")
    return items


def checked_score(index: int, value: Any) -> float:
    """One score as a float (NaN: None, does not apply); BadScore naming what is wrong with it."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        try:
            float(value)
            hint = f": return the number, float({value!r})"
        except ValueError:
            hint = ""
        raise BadScore(index, f"is the string {value[:40]!r}, not a number{hint}")
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # a 0-d tensor or numpy scalar
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise BadScore(index, f"is a {_type_name(value)} ({shown(value)}), not a number (one score per completion)")
    try:
        score = float(value)
    except (OverflowError, ValueError, TypeError, ArithmeticError):  # 10**400, a Fraction of such, a broken __float__
        raise BadScore(index, f"{shown(value)} is out of range: {ALLOWED} (it does not even fit a float)") from None
    if math.isnan(score):
        raise BadScore(index, "is NaN: return None for a completion a reward does not apply to")
    if math.isinf(score):
        raise BadScore(index, f"is {score}: scores must be finite")
    if abs(score) > MAX_ABS_REWARD:
        raise BadScore(index, f"{shown(value)} is out of range: {ALLOWED} (larger ones overflow float32 and swamp "
                       "every other reward)")
    return score


ALLOWED = f"a score must lie within +-{MAX_ABS_REWARD:g}"


def shown(value: Any, limit: int = 40) -> str:
    """`value` shortened for a one-line message: a huge integer by its size (its digits would fill the screen, and
    past 4300 digits Python refuses to print it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object whose repr fails: its type says enough
        text = f"a {_type_name(value)}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def checked_weight(what: str, weight: Any) -> float:
    """A reward's weight as a float: a finite number within +-MAX_ABS_WEIGHT (a NaN or 1e300 weight would train on
    NaN/inf rewards); ValueError naming `what` and the value otherwise."""
    try:
        value = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: weight {shown(weight)} is not a number") from None
    except OverflowError:  # an integer too large for a float
        value = math.inf
    if not math.isfinite(value) or abs(value) > MAX_ABS_WEIGHT:
        raise ValueError(f"{what}: weight {shown(weight)} is out of range: it must be a finite number in "
                         f"[-{MAX_ABS_WEIGHT:g}, {MAX_ABS_WEIGHT:g}]")
    return value


def split_reward_spec(spec: str) -> tuple[str, str, float | None]:
    """(name or "", target, weight or None) of a `name=target*weight` reward entry (name and weight optional), the
    weight checked."""
    name, _, rest = spec.partition("=") if "=" in spec.split(":")[0] else ("", "", spec)
    target, _, weight = rest.rpartition("*") if "*" in rest else (rest, "", "")
    return name, target, checked_weight(f"reward {spec!r}", weight) if weight else None
