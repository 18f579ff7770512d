"""Experiment trackers (accelerate's): a tracker asked for must be installed, or the run does not start."""

from __future__ import annotations

import importlib.util

from vlm_grpo.grpo.settings.fields import SettingError
from vlm_grpo.grpo.settings.sections import TRACKERS

TRACKER_PROJECT = "vlm-grpo"  # tensorboard writes under RUN_DIR/vlm-grpo
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
