"""What `resume_from` (--resume-from; TRL's train(resume_from_checkpoint=PATH)) may name: one checkpoint-N folder of
a run. A run's own folder, its final/ model, a file or a missing path are refused in one line saying what was given
and what to pass instead (the run's newest checkpoint when it has one), before a run directory is made."""

from __future__ import annotations

from pathlib import Path

from vlm_grpo.grpo.checkpoint.store import STATE_FILE, latest_checkpoint
from vlm_grpo.grpo.setting_fields import SettingError

FINAL_DIR = "final"  # a run's finished model: weights and processor, no optimizer state


def check_resume_from(path: str | Path, resume: str = "--resume") -> Path:
    """`path` as a checkpoint folder; SettingError naming resume_from otherwise. `resume`: how the caller asks for
    the newest checkpoint of the run directory instead (the flag, or TRL's argument)."""
    given = Path(path)
    if (given / STATE_FILE).is_file():
        return given
    raise SettingError("resume_from", f"{path} {_what_it_is(given)}: {_instead(given, resume)}")


def _what_it_is(given: Path) -> str:
    if not given.exists():
        return "does not exist"
    if not given.is_dir():
        return "is a file, not a checkpoint folder"
    if latest_checkpoint(given) is not None:
        return "is a run folder, not one of its checkpoints"
    if given.name == FINAL_DIR:
        return "is a run's final model, not a checkpoint (it holds no optimizer state)"
    return f"is not a checkpoint (no {STATE_FILE})"


def _instead(given: Path, resume: str) -> str:
    own = latest_checkpoint(given) if given.is_dir() else None
    if own is not None:
        return f"pass {own} (its newest), or {resume} with that run as the output folder"
    if given.name == FINAL_DIR and given.is_dir():
        newest = latest_checkpoint(given.parent)
        start = f"start a new run from it with --init-from {given}"
        return f"pass {newest} (the run's newest checkpoint), or {start}" if newest else start
    return f"pass a run's checkpoint-N folder, or {resume} to continue from the newest one in the output folder"
