"""QLoRA wherever bitsandbytes runs (here: the CPU): every family's tiny twin loads with 4-bit layers, passes the
cache probe, trains 2 GRPO steps with LoRA on the 4-bit base, and its saved adapter loads back onto a fresh 4-bit
base with the same outputs; the merged copy folds the deltas into the full-precision base."""

from __future__ import annotations

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters import quantization
from vlm_grpo.adapters.model_dirs import MERGED_DIR
from vlm_grpo.compat.cache_probe import probe_cache
from vlm_grpo.grpo.checkpoint.store import load_weights
from vlm_grpo.grpo.settings.sections import LoraSettings
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.training.lora import apply_lora
from vlm_grpo.loader import load_model
from tests.trained import trained

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4", "--batch-size", "1",
        "--num-generations", "2", "--logging.progress", "false", "--beta", "0.04", "--learning-rate", "1e-2",
        "--data.rewards", "lower=tests.grpo.toy_rewards:lowercase_share"]


def _four_bit_layers(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]


def _logits(adapter) -> torch.Tensor:
    batch = adapter.encode_prompts([user_turn(1, "How many red squares?")], [[picture(56, 56, 1)]])
    with torch.no_grad():
        return adapter.model(**adapter.model_inputs(batch)).logits


def test_qlora_trains_probes_and_saves_every_family(family, tmp_path):
    merged = family == "qwen2_5_vl"  # the merged copy (a full-precision reload) is checked on one family
    cfg = load_config(overrides=["--model", f"tiny:{family}", "--output-dir", str(tmp_path), "--max-steps", "2",
                                 "--load-in-4bit", "true", "--lora.r", "4", "--logging.save_merged", str(merged).lower(),
                                 *FAST])
    trainer = GRPOTrainer.from_settings(cfg)
    model = trainer.adapter.model
    assert quantization.is_loaded_in_4bit(model) and _four_bit_layers(model)
    lora = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert lora and all(p.requires_grad for p in lora.values())
    history = trained(trainer)
    assert [m["step"] for m in history] == [1, 2] and all(m["grad_norm"] > 0 for m in history)
    assert any(p.abs().max() > 0 for p in lora.values())  # lora_B starts at 0: the updates moved it
    # bitsandbytes' CPU inference layout (no input gradient) never replaced the trainable one
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False)
                   for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu"))

    report = probe_cache(trainer.adapter, steps=2)  # the 4-bit policy, LoRA on
    assert report.cache_ok and not report.blind, report.table()

    final = tmp_path / "final"
    assert (final / "adapter_model.safetensors").is_file()
    reloaded = load_model(f"tiny:{family}", load_in_4bit=True, device="cpu", decide_cache=False)
    apply_lora(reloaded, cfg.lora)
    load_weights(reloaded.model, final)
    torch.testing.assert_close(_logits(reloaded), _logits(trainer.adapter), rtol=0, atol=1e-5)

    if merged:  # the deltas on the full-precision base: W + B A * scale, for a LoRA target
        full = load_model(f"tiny:{family}", device="cpu", decide_cache=False).model.state_dict()
        saved = type(trainer.adapter.model.get_base_model()).from_pretrained(final / MERGED_DIR).state_dict()
        name, module = next((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A") and "q_proj" in n)
        delta = (module.lora_B["default"].weight @ module.lora_A["default"].weight) * module.scaling["default"]
        key = name.removeprefix("base_model.model.") + ".weight"
        assert saved[key].dtype == torch.float32  # not 4-bit
        torch.testing.assert_close(saved[key], full[key] + delta.detach(), rtol=0, atol=1e-6)


def test_a_4bit_layer_keeps_its_input_gradient_after_an_inference_call():
    """A rollout calls the 4-bit layers in eval mode without gradient; the next update still gets the gradient of
    each layer's input (bitsandbytes' CPU inference repacking would drop it)."""
    adapter = load_model("tiny:qwen2_5_vl", load_in_4bit=True, device="cpu", decide_cache=False)
    layer = adapter.model.get_submodule(_four_bit_layers(adapter.model)[-1])
    x = torch.randn(3, layer.in_features)
    adapter.model.eval()
    with torch.no_grad():
        layer(x)
    adapter.model.train()
    x.requires_grad_(True)
    layer(x).sum().backward()
    weight = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    torch.testing.assert_close(x.grad, weight.sum(0).expand_as(x), rtol=1e-4, atol=1e-5)


def test_qlora_errors_name_what_is_missing(monkeypatch):
    adapter = load_model("tiny:smolvlm", device="cpu", decide_cache=False)
    with pytest.raises(ValueError, match="must already be loaded in 4 bit"):
        apply_lora(adapter, LoraSettings(r=4, load_in_4bit=True))
    with pytest.raises(ValueError, match="set r > 0"):
        LoraSettings(load_in_4bit=True)
    real = quantization.importlib.util.find_spec
    monkeypatch.setattr(quantization.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(RuntimeError, match="needs bitsandbytes: pip install bitsandbytes"):
        load_model("tiny:smolvlm", load_in_4bit=True, device="cpu", decide_cache=False)
