"""run_state.json (and trainer_state.json) checked against their schema before any value is used: the keys a run
writes, each of its type and within a size. A checkpoint may come from someone else; a bad field is refused in one
line naming the file and the field (exit 2), before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from vlm_grpo.grpo.setting_fields import SettingError

MAX_FILE_BYTES = 64 << 20  # a run state is kilobytes; the log history of a long run a few megabytes
MAX_TEXT = 4096
MAX_ITEMS = 100_000
MAX_DEPTH = 8
STAGES = ("grpo", "sft", "train")


class BadRunState(SettingError):
    def __init__(self, path: Path, field: str, problem: str):
        super().__init__("resume", f"{path}: field `{field}` {problem}; the checkpoint's state is refused (restore the "
                         "file, or start a new run)")


def _int(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {type(value).__name__}"
        if not low <= value <= high:
            return f"must be between {low} and {high}, got {value}"
        return None
    return check


def _text(most: int = MAX_TEXT, choices: tuple[str, ...] = ()) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be text, got {type(value).__name__}"
        if len(value) > most:
            return f"is {len(value)} characters long, at most {most}"
        if choices and value not in choices:
            return f"must be one of {', '.join(choices)}, got {value[:40]!r}"
        return None
    return check


def plain_problem(value: Any, field: str, depth: int = 0) -> tuple[str, str] | None:
    """(field, problem) for the first part of `value` that is not plain JSON data within the sizes, else None."""
    if depth > MAX_DEPTH:
        return field, f"is nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):  # NaN included: a logged metric may be one
        return None
    if isinstance(value, str):
        return (field, f"is {len(value)} characters long, at most {MAX_ITEMS}") if len(value) > MAX_ITEMS else None
    if isinstance(value, list):
        if len(value) > MAX_ITEMS:
            return field, f"holds {len(value)} items, at most {MAX_ITEMS}"
        for k, item in enumerate(value):
            found = plain_problem(item, f"{field}[{k}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            return field, f"holds {len(value)} keys, at most {MAX_ITEMS}"
        for key, item in value.items():
            found = plain_problem(item, f"{field}.{key}", depth + 1)
            if found:
                return found
        return None
    return field, f"is not plain data ({type(value).__name__})"


def _mapping(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be a mapping, got {type(value).__name__}"


def _history_entry(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be a mapping, got {type(value).__name__}"
    unknown = set(value) - {"resumed_at_step", "from", "accepted", "changed"}
    if unknown:
        return f"has unknown keys {sorted(map(str, unknown))[:4]}"
    for key, check in (("resumed_at_step", _int(0, 10**9)), ("from", _text())):
        if key not in value:
            return f"lacks `{key}`"
        problem = check(value[key])
        if problem:
            return f"`{key}` {problem}"
    for key in ("accepted", "changed"):
        changes = value.get(key, {})
        if not isinstance(changes, dict):
            return f"`{key}` must be a mapping, got {type(changes).__name__}"
        for name, change in changes.items():
            if not isinstance(change, dict) or set(change) != {"was", "now"}:
                return f"`{key}.{name}` must be a mapping of `was` and `now`"
    return None


def _history(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list, got {type(value).__name__}"
    if len(value) > 10_000:
        return f"holds {len(value)} resumes, at most 10000"
    for k, entry in enumerate(value):
        problem = _history_entry(entry)
        if problem:
            return f"entry {k} {problem}"
    return None


def _rollout_source(value: Any) -> str | None:
    """The rollout batches' cursor (parts/rollout_source.py): whole numbers, none before another."""
    if not isinstance(value, dict):
        return f"must be a mapping, got {type(value).__name__}"
    for key in value:
        if key not in ("cursor", "generation_start", "issued"):
            return f"holds `{str(key)[:60]}`, not one of cursor, generation_start, issued"
    for key in ("cursor", "generation_start"):
        if key not in value:
            return f"lacks `{key}`"
    for key, number in value.items():
        problem = _int(0, 10**12)(number)
        if problem:
            return f"`{key}` {problem}"
    if value["generation_start"] > value["cursor"] or value.get("issued", value["cursor"]) < value["cursor"]:
        return "must have generation_start <= cursor <= issued"
    return None


RUN_STATE: dict[str, Callable[[Any], str | None]] = {  # key -> check; `step` is the only required one
    "step": _int(0, 10**9),
    "config": _mapping,
    "num_processes": _int(1, 1_000_000),
    "stage": _text(32, STAGES),
    "fsdp": _text(64),
    "history": _history,
    "optimizer_updates": _int(0, 10**12),
    "entropy_control": _mapping,
    "guards": _mapping,
    "step_log": _mapping,  # what the step log counts across steps (TRL's num_tokens)
    "rollout_source": _rollout_source,
}


def read_json(path: Path) -> Any:
    """A state file's JSON, refused in one line when too large or not JSON."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BadRunState(path, "(the file)", f"is {size} bytes, at most {MAX_FILE_BYTES}")
    try:
        return json.loads(path.read_bytes().decode("utf-8"), parse_constant=lambda name: float(name))
    except (UnicodeDecodeError, ValueError) as err:
        raise BadRunState(path, "(the file)", f"is not JSON ({str(err).splitlines()[0][:120]})") from None


def check_run_state(state: Any, path: Path, required: tuple[str, ...] = ("step",)) -> dict[str, Any]:
    """`state` as read from `path`, checked key by key (unknown keys, wrong types, sizes); returns it."""
    if not isinstance(state, dict):
        raise BadRunState(path, "(the file)", f"must hold a mapping, got {type(state).__name__}")
    for key in required:
        if key not in state:
            raise BadRunState(path, key, "is missing")
    for key, value in state.items():
        if key not in RUN_STATE:
            raise BadRunState(path, str(key)[:60], "is not a run-state key")
        problem = RUN_STATE[key](value)
        if problem:
            raise BadRunState(path, key, problem)
        found = plain_problem(value, key)
        if found:
            raise BadRunState(path, *found)
    return state


def check_trainer_state(saved: Any, path: Path) -> dict[str, Any]:
    """trainer_state.json: what is used of it (global_step, log_history) of its type and size."""
    if not isinstance(saved, dict):
        raise BadRunState(path, "(the file)", f"must hold a mapping, got {type(saved).__name__}")
    problem = _int(0, 10**9)(saved.get("global_step"))
    if problem:
        raise BadRunState(path, "global_step", problem)
    history = saved.get("log_history", [])
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise BadRunState(path, "log_history", "must be a list of mappings")
    for k, row in enumerate(history):
        if "step" in row and _int(0, 10**9)(row["step"]):
            raise BadRunState(path, f"log_history[{k}].step", _int(0, 10**9)(row["step"]))
    found = plain_problem(history, "log_history")
    if found:
        raise BadRunState(path, *found)
    return saved
