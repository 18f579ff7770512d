"""What a resumed run may change: its settings against the checkpoint's, before any model loads. Each setting's
policy is declared with it (`setting(resume=...)` or its section's RESUME, grpo/setting_fields.py):

- Safe changes are honoured: a later `max_steps`, logging and save cadence, guards, evaluation, performance
  switches, the device.
- Changes to what the run means (data, rewards, batch, num_generations, generation, loss, learning rates and
  schedule, seed, the process count) are refused, naming each difference, unless accepted by name with
  `--resume-accept KEY,...` (or `all`); accepted ones are honoured from the resumed step on.
- Changes the checkpoint's weights and optimizer state are shaped by (model, dtype, LoRA, what is frozen, FSDP)
  cannot be resumed at all: that is a new run.

Every resume is recorded in the run's history (config.yaml, the checkpoints, the model card): the step it
resumed at and each setting that changed there, was -> now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlm_grpo.grpo.setting_fields import SettingError

PROCESSES = "num_processes"  # not a setting: how many processes trained (each draws its own prompts)


def flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Settings by dotted key, `section.field` (a field's own mapping, such as recipe_options, kept whole)."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict) and not prefix and key not in ("history",):
            out.update(flat(value, f"{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass
class Change:
    key: str
    was: Any
    now: Any
    kind: str  # safe | accepted | refused | fixed

    def line(self) -> str:
        return f"{self.key} {self.was!r} -> {self.now!r}"


def compare(saved: dict[str, Any], current: dict[str, Any], accept: list[str], policies: dict[str, str]) -> list[Change]:
    """Every setting that differs between the checkpoint's settings and the run's, classified by its declared
    resume policy (`policies`: key -> honoured | refused | fixed | ignored; grpo/setting_fields.py)."""
    old, new = flat(saved), flat(current)
    accept_all = "all" in accept
    changes = []
    for key, now in new.items():
        policy = policies.get(key, "refused")
        if key not in old or policy == "ignored" or _normal(old[key]) == _normal(now):
            continue  # a setting the checkpoint predates is not compared
        if policy == "honoured":
            kind = "safe"
        elif policy == "fixed":
            kind = "fixed"
        else:
            kind = "accepted" if accept_all or key in accept else "refused"
        changes.append(Change(key, old[key], now, kind))
    return changes


def _normal(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def check_resume(state: dict[str, Any], current: dict[str, Any], *, checkpoint: str, stage: str, num_processes: int,
                 accept: list[str], policies: dict[str, str]) -> list[Change]:
    """The changes a resume from `checkpoint` (its trainer state) makes; raises SettingError, naming every refused
    difference, when it may not go on."""
    saved = dict(state.get("config") or {})
    step = int(state["step"])
    if state.get("stage", stage) != stage:
        raise SettingError("resume", f"{checkpoint} was written by the {state['stage']} stage, not {stage}: start a "
                           "new run from its weights with --init-from instead")
    # a run counted in epochs has its max_steps once the data is read, after this check (base.py)
    if not current.get("epochs") and current.get("max_steps", step) < step:
        raise SettingError("max_steps", f"{current['max_steps']} is below {checkpoint}'s step {step}: a resumed run "
                           f"continues to a max_steps of at least {step}")
    saved_processes = state.get(PROCESSES)
    changes = compare(saved, current, accept, policies)
    if saved_processes is not None and saved_processes != num_processes:
        kind = "accepted" if "all" in accept or PROCESSES in accept else "refused"
        changes.append(Change(PROCESSES, saved_processes, num_processes, kind))
    fixed = [c for c in changes if c.kind == "fixed"]
    if fixed:
        raise SettingError("resume", f"{checkpoint} cannot continue with {'; '.join(c.line() for c in fixed)}: the "
                           "checkpoint's weights and optimizer state are shaped by these, so this is a new run "
                           "(another --output-dir, or --overwrite-output-dir)")
    refused = [c for c in changes if c.kind == "refused"]
    if refused:
        keys = ",".join(c.key for c in refused)
        raise SettingError("resume", f"these settings differ from {checkpoint}'s and change what the run means: "
                           f"{'; '.join(c.line() for c in refused)}. Resume with the checkpoint's values, accept the "
                           f"changes with --resume-accept {keys} (recorded in config.yaml's history and the model "
                           "card), or start a new run")
    return changes


def history_entry(checkpoint: str, step: int, changes: list[Change]) -> dict[str, Any]:
    """One resume, as config.yaml's `history` and the model card record it."""
    entry: dict[str, Any] = {"resumed_at_step": step, "from": checkpoint}
    for kind in ("accepted", "safe"):
        picked = {c.key: {"was": c.was, "now": c.now} for c in changes if c.kind == kind}
        if picked:
            entry["accepted" if kind == "accepted" else "changed"] = picked
    return entry


def describe_history(history: list[dict[str, Any]]) -> list[str]:
    """One line per resume: where it resumed and what changed there."""
    lines = []
    for entry in history:
        parts = [f"{k} {v['was']!r} -> {v['now']!r}" for k, v in entry.get("accepted", {}).items()]
        safe = [f"{k} {v['was']!r} -> {v['now']!r}" for k, v in entry.get("changed", {}).items()]
        text = f"resumed at step {entry['resumed_at_step']} from {entry['from']}"
        if parts:
            text += f"; accepted changes: {', '.join(parts)}"
        if safe:
            text += f"; other changes: {', '.join(safe)}"
        lines.append(text)
    return lines
