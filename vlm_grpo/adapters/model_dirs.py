"""What a checkpoint directory (or hub id) says about itself before any weights load."""

from __future__ import annotations

import json
from pathlib import Path

MERGED_DIR = "merged"  # under a LoRA run's final/: the full model with the LoRA deltas folded in


def read_model_type(path: str) -> str:
    """`model_type` of a checkpoint directory's config.json, or of a hub id's config."""
    config_file = Path(path) / "config.json"
    if config_file.is_file():
        return json.loads(config_file.read_text())["model_type"]
    from transformers import AutoConfig  # a hub id: let transformers fetch (or find in its cache)

    return AutoConfig.from_pretrained(path, trust_remote_code=False).model_type  # never a y/N prompt


def auto_classes(path: str) -> tuple[str, ...]:
    """The transformers Auto classes a local checkpoint's own code provides (config.json's `auto_map` keys)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return ()
    auto_map = json.loads(config_file.read_text()).get("auto_map") or {}
    return tuple(auto_map) if isinstance(auto_map, dict) else ()


def checkpoint_path(path: str) -> str:
    """A LoRA run's `final/` holds only the adapter: a model is loaded from its merged copy. A run's own folder is
    refused naming the models inside it (its final/, its newest checkpoint-N)."""
    p = Path(path)
    if p.is_dir() and not (p / "config.json").is_file():
        inside = _run_models(p)
        if inside:
            raise ValueError(f"{path} is a run folder, not a model: pass {' or '.join(inside)}")
    if p.is_dir() and not (p / "config.json").is_file() and (p / "adapter_config.json").is_file():
        if (p / MERGED_DIR / "config.json").is_file():
            return str(p / MERGED_DIR)
        raise ValueError(
            f"{path} holds only a LoRA adapter and no merged model; train with logging.save_merged true, "
            "or merge the adapter into its base first"
        )
    return path


def _run_models(run_dir: Path) -> list[str]:
    """The models a run folder holds, as a message offers them: its final/, its newest checkpoint-N."""
    steps = [(int(d.name.split("-", 1)[1]), d) for d in run_dir.glob("checkpoint-*")
             if d.is_dir() and d.name.split("-", 1)[1].isdigit()]
    found = [f"{run_dir / 'final'} (its final model)"] if (run_dir / "final").is_dir() else []
    if steps:
        found.append(f"{max(steps)[1]} (its newest checkpoint)")
    return found
