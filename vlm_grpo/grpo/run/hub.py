"""Pushing a run's final/ (weights or LoRA adapter, processor, model card, settings) to a model hub."""

from __future__ import annotations

from pathlib import Path


def push_final(final: Path, repo_id: str, *, private: bool = False, commit_message: str = "vlm-grpo run") -> str:
    """Create the repo if needed and upload `final`; returns the commit's URL. The endpoint and token are
    huggingface_hub's (HF_ENDPOINT, HF_TOKEN or a saved login)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    info = api.upload_folder(folder_path=str(final), repo_id=repo_id, repo_type="model", commit_message=commit_message)
    return str(getattr(info, "commit_url", info))
