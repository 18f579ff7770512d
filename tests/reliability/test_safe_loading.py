"""Safe loading: pickled weights and remote code are refused unless asked for."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.adapters.registry import family_class
from vlm_grpo.loader import load_model


def test_pickled_weights_refused_unless_allowed(tmp_path):
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    adapter.processor.save_pretrained(tmp_path)
    adapter.model.config.save_pretrained(tmp_path)
    torch.save(adapter.model.state_dict(), tmp_path / "pytorch_model.bin")  # a pickle-only checkpoint
    with pytest.raises(OSError, match="safetensors|model.safetensors"):
        load_model(f"qwen2_5_vl:{tmp_path}")
    loaded = load_model(f"qwen2_5_vl:{tmp_path}", allow_pickle_weights=True)
    assert loaded.model.config.model_type == "qwen2_5_vl"


def test_remote_code_is_off_by_default(tmp_path, monkeypatch):
    seen = {}
    cls = family_class("qwen2_5_vl")

    def fake(path, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cls.model_class, "from_pretrained", fake)
    with pytest.raises(RuntimeError, match="stop here"):
        cls.load(str(tmp_path))
    assert seen["trust_remote_code"] is False and seen["use_safetensors"] is True
