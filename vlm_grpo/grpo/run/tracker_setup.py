"""Experiment trackers (accelerate's): a tracker asked for must be installed, or the run does not start."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sections import TRACKERS

TRACKER_PROJECT = "vlm-grpo"  # tensorboard writes under RUN_DIR/vlm-grpo; trackio's project name
TRACKIO_FOLDER = "trackio"  # trackio's files inside the run directory (when TRACKIO_DIR is not set)
PACKAGES = {name: name for name in TRACKERS}  # the package each tracker needs


def check_trackers(report_to: list[str]) -> None:
    missing = [name for name in report_to if importlib.util.find_spec(PACKAGES[name]) is None]
    if missing:
        raise SettingError("logging.report_to", f"{', '.join(missing)} not installed: pip install "
                           + " ".join(f"'vlm-grpo[{m}]'" for m in missing) + " (or drop it from report_to)")


def flat_settings(d: dict, prefix: str = "") -> dict:
    """Nested settings as `section.field` keys (trackers take flat configs)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def use_trackio_dir(run_dir: Path) -> Path:
    """Where trackio keeps the run's project (its dashboard reads it): TRACKIO_DIR when set, else <run_dir>/trackio,
    so a run leaves nothing outside its directory. trackio reads the variable once, when it is first imported."""
    if "TRACKIO_DIR" not in os.environ and "trackio" not in sys.modules:
        os.environ["TRACKIO_DIR"] = str(Path(run_dir).resolve() / TRACKIO_FOLDER)
    from trackio.utils import TRACKIO_DIR

    return Path(TRACKIO_DIR)


def claim_tracker_folders(run_dir: Path, report_to, is_main: bool) -> Path | None:
    """Before the trackers start: their folders in the run directory checked (no links) and listed as the run's
    (grpo/safe_files.py), trackio pointed inside the run; the trackio folder, whose dashboard command is printed."""
    trackio_dir = use_trackio_dir(run_dir) if "trackio" in report_to else None
    if is_main:
        for folder in (TRACKER_PROJECT, TRACKIO_FOLDER):
            safe_files.check_path(Path(run_dir) / folder)
        safe_files.CreatedFiles(run_dir).add(TRACKER_PROJECT, *([TRACKIO_FOLDER] if trackio_dir else []))
        if trackio_dir is not None:
            print(f"trackio dashboard: TRACKIO_DIR={trackio_dir} trackio show --project {TRACKER_PROJECT}")
    return trackio_dir
