"""Experiment trackers (accelerate's): a tracker asked for must be installed, or the run does not start."""

from __future__ import annotations

import importlib.util

from vlm_grpo.grpo.settings import SettingError

TRACKER_PROJECT = "vlm-grpo"  # tensorboard writes under RUN_DIR/vlm-grpo
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


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
