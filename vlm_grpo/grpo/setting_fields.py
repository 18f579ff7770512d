"""Settings declared once, with their help and their limits, and checked wherever they come from.

Every field of a settings dataclass is made with `setting(default, help=..., ...)`: the help text feeds
`vlm-grpo train --help`, and the limits (`choices`, `at_least`, `above`, `below`, `at_most`) are checked by
`check_fields` when the dataclass is built: from defaults, YAML, the command line or Python alike. A failing
value raises `SettingError` naming the setting and what is allowed, in one line.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Sequence

from vlm_grpo.grpo.yaml_text import YAMLProblem, load_yaml


class SettingError(ValueError):
    """A setting whose value cannot work; the message names it and says what is allowed."""

    def __init__(self, name: str, problem: str):
        self.name, self.problem = name, problem
        super().__init__(f"setting {name!r}: {problem}")

    def within(self, section: str) -> "SettingError":
        return SettingError(f"{section}.{self.name}", self.problem)


class ArgumentTypeError(TypeError, ValueError):
    """An argument of a public class or function given a type it does not take; one line naming the argument. A
    TypeError, and a ValueError as the command line and scripts catching refused input take it."""


# What a resumed run may do with a setting that differs from its checkpoint's (grpo/checkpoint/resume_rules.py):
# honoured (safe: logging, guards, a later max_steps ...), refused unless accepted with --resume-accept (it changes
# what the run means), fixed (the checkpoint's weights and optimizer state are shaped by it: a new run), ignored
# (derived, or how the run resumes). A section's RESUME class attribute is its fields' default; else "refused".
RESUME_POLICIES = ("honoured", "refused", "fixed", "ignored")


def setting(default: Any = dataclasses.MISSING, *, help: str, factory: Any = dataclasses.MISSING,
            choices: Sequence[Any] | None = None, at_least: float | None = None, above: float | None = None,
            below: float | None = None, at_most: float | None = None, values: dict[Any, Any] | None = None,
            resume: str | None = None):
    """A dataclass field with its one-line help, its limits and its resume policy (None: its section's). `values`
    maps accepted spellings to the stored value (e.g. TRL's `scale_rewards: false` -> "none"); `choices` apply to
    each item of a list."""
    if resume is not None and resume not in RESUME_POLICIES:
        raise ValueError(f"resume={resume!r}: one of {', '.join(RESUME_POLICIES)}")
    meta = {"help": help, "choices": tuple(choices) if choices else None, "at_least": at_least, "above": above,
            "below": below, "at_most": at_most, "values": values or {}, "resume": resume}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_fields(obj: Any) -> None:
    """Map spellings and check every field of a settings dataclass against its declared limits."""
    for f in dataclasses.fields(obj):
        meta = f.metadata
        if "help" not in meta:
            continue
        value = getattr(obj, f.name)
        spellings = meta["values"]
        if spellings and _hashable(value) and value in spellings:
            value = spellings[value]
            setattr(obj, f.name, value)
        elif isinstance(value, bool) and meta["choices"]:
            value = _word_yaml_read_as(value, meta["choices"])
            setattr(obj, f.name, value)
        if value is None:
            continue
        # a list's limits are its items' (choices of freeze, the range of each reward weight)
        items = value if isinstance(value, (list, tuple)) and (meta["choices"] or has_range(meta)) else [value]
        for item in items:
            _check(f.name, item, meta)


BOUNDS = (("at_least", ">="), ("above", ">"), ("below", "<"), ("at_most", "<="))


def has_range(meta: Any) -> bool:
    return any(meta.get(key) is not None for key, _ in BOUNDS)


def range_text(meta: Any) -> str:
    """The declared range in interval notation: [0.0, 10.0], (0.0, 100.0], [1, 65536]."""
    low = next(((meta[k], b) for k, b in (("at_least", "["), ("above", "(")) if meta.get(k) is not None), None)
    high = next(((meta[k], b) for k, b in (("at_most", "]"), ("below", ")")) if meta.get(k) is not None), None)
    left = f"{low[1]}{_number(low[0])}" if low else "(-inf"
    right = f"{_number(high[0])}{high[1]}" if high else "inf)"
    return f"{left}, {right}"


def _number(bound: float) -> str:
    return repr(bound) if isinstance(bound, float) and abs(bound) < 1e5 else f"{bound:g}" if isinstance(bound, float) else str(bound)


def _check(name: str, value: Any, meta: dict) -> None:
    if meta["choices"] and value not in meta["choices"]:
        raise SettingError(name, f"{value!r} is not one of {', '.join(map(str, meta['choices']))}")
    if isinstance(value, float) and not math.isfinite(value):  # nan, inf: never a usable setting
        raise SettingError(name, f"{value!r} is not a finite number" + (f" (allowed: {range_text(meta)})"
                                                                         if has_range(meta) else ""))
    checks = {">=": lambda v, b: v >= b, ">": lambda v, b: v > b, "<": lambda v, b: v < b, "<=": lambda v, b: v <= b}
    for key, sign in BOUNDS:
        bound = meta[key]
        if bound is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise SettingError(name, f"{value!r} is not a finite number (allowed: {range_text(meta)})")
        if not checks[sign](value, bound):
            raise SettingError(name, f"{_value_text(value)} is out of range: it must be {sign} {_number(bound)} "
                               f"(allowed: {range_text(meta)})")


# YAML 1.1 (PyYAML) reads these words as booleans: `mixed_precision: no` arrives as False, `padding_free: on` as True
_YAML_BOOL_WORDS = {False: ("no", "off", "false", "n"), True: ("yes", "on", "true", "y")}


def _word_yaml_read_as(value: bool, choices: Sequence[Any]) -> Any:
    """The one choice a YAML boolean was written as; the boolean itself (refused by the check) if none or several."""
    words = [c for c in choices if isinstance(c, str) and c.lower() in _YAML_BOOL_WORDS[value]]
    return words[0] if len(words) == 1 else value


def _value_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{value:.4g}"  # 2**70 as 1.181e+21, not 22 digits


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def help_of(f: dataclasses.Field) -> str:
    """The field's help text plus its limits, for the settings listing."""
    meta = f.metadata
    limits = []
    if meta.get("choices"):
        limits.append("one of " + " | ".join(map(str, meta["choices"])))
    if has_range(meta):
        limits.append(range_text(meta))
    return meta.get("help", "") + (f" [{', '.join(limits)}]" if limits else "")


def coerce(value: Any, hint: Any, key: str) -> Any:
    """A YAML or command-line value as the field's type; a value that is not is an error naming the setting."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if isinstance(value, str) and hint is not str:
        value = inline_yaml(value, key)
    try:
        if hint is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if hint in (int, float):
            if isinstance(value, str):  # YAML reads 1e8 (no dot) as text: a number all the same, then range-checked
                value = float(value)
            if isinstance(value, bool) or (hint is int and isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return hint(value)
        if hint is str:
            if isinstance(value, (dict, list)):
                raise TypeError
            return str(value) if not isinstance(value, bool) else value  # a bool may be a spelling (see `values`)
        if origin in (list, tuple):
            items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v]
            item_type = (typing.get_args(hint) or (str,))[0]
            items = [coerce(v, item_type, key) for v in items]
            return tuple(items) if origin is tuple else items
        if origin is dict and not isinstance(value, dict):
            raise TypeError
    except (TypeError, ValueError):
        raise SettingError(key, f"{value!r} is not a valid {getattr(hint, '__name__', hint)}") from None
    return value


def inline_yaml(text: str, key: str) -> Any:
    """A command-line value parsed as YAML; malformed text is an error naming the setting and the column."""
    try:
        return load_yaml(text, key, inline=True)
    except YAMLProblem as err:
        raise SettingError(key, str(err)) from None


def resume_policies(settings: Any) -> dict[str, str]:
    """Each setting's resume policy by its dotted key (`section.field`, or `field` at the top), as declared."""
    def policy(f: dataclasses.Field, owner: Any) -> str:
        return f.metadata.get("resume") or getattr(type(owner), "RESUME", "refused")

    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{g.name}": policy(g, value) for g in dataclasses.fields(value)})
        else:
            out[f.name] = policy(f, settings)
    return out
