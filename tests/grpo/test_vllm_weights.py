"""The policy's weights as a vLLM push reads them (rollout/vllm/weights.py), checked against independent references:
the plain model's state_dict, peft's own `merge_and_unload()` and `get_peft_model_state_dict`, an adapter checkpoint
that peft itself loads back, and (under FSDP2 on 2 CPU processes) the unsharded model, one shard unit gathered at a
time. vLLM is not needed: everything here is what the trainer side sends."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters.registry import adapter_class
from vlm_grpo.grpo.rollout.vllm.lora_sync import plan_lora, write_adapter
from vlm_grpo.grpo.rollout.vllm.weights import (
    PARTS,
    PolicyWeights,
    checkpoint_name,
    export_config,
    model_signature,
    pushed_weights,
)
from vlm_grpo.grpo.settings.sections import LoraSettings
from vlm_grpo.grpo.training.lora import apply_lora

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_weights_worker.py")


def tiny(family: str):
    return adapter_class(family).tiny(seed=0)


def with_lora(family: str, seed: int = 0, r: int = 4, train_fully=(), **settings):
    """A fresh tiny twin with LoRA whose matrices are all random and non-zero (lora_B starts at zero otherwise)."""
    adapter = tiny(family)
    torch.manual_seed(seed)
    apply_lora(adapter, LoraSettings(r=r, alpha=2 * r, **settings), train_fully=train_fully)
    randomize_lora(adapter.model, seed)
    return adapter


def randomize_lora(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.2)


def streamed(model, part: str = "merged", root=None) -> list[tuple[str, torch.Tensor]]:
    return [(name, tensor.detach().clone()) for name, tensor in PolicyWeights(model, root).stream(part)]


def assert_same(got: list[tuple[str, torch.Tensor]], want: dict[str, torch.Tensor], what: str) -> None:
    """Same names in the same order, bitwise-equal tensors of the same dtype."""
    names = [name for name, _ in got]
    assert len(set(names)) == len(names), f"{what}: a name streamed twice"
    assert names == list(want), (f"{what}: only streamed {sorted(set(names) - set(want))[:4]}, "
                                 f"never streamed {sorted(set(want) - set(names))[:4]}")
    for name, tensor in got:
        ref = want[name]
        assert tensor.dtype == ref.dtype and tensor.shape == ref.shape, (what, name, tensor.dtype, ref.dtype)
        assert torch.equal(tensor, ref), f"{what}: {name} differs by {(tensor.float() - ref.float()).abs().max()}"


def peft_merged_state(model) -> dict[str, torch.Tensor]:
    """peft's own merge, on a copy (the policy keeps its adapter)."""
    return copy.deepcopy(model).merge_and_unload().state_dict()


# ---------------------------------------------------------------------------------------------- full weights
@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3", "internvl", "hybrid_llava", "gemma3"])
def test_merged_stream_of_a_model_without_lora_is_its_state_dict(family):
    model = tiny(family).model
    want = model.state_dict()
    assert_same(streamed(model), want, family)
    # nothing to merge, no adapter: base equals merged, the adapter part is empty
    assert [n for n, _ in PolicyWeights(model).stream("base")] == list(want)
    assert list(PolicyWeights(model).stream("adapter")) == []
    assert not PolicyWeights(model).has_lora


@pytest.mark.parametrize("family", ["qwen2_5_vl", "hybrid_llava"])
def test_a_tied_tensor_is_streamed_under_each_of_its_names(family):
    """Tied input and output embeddings (Qwen2.5-VL-3B's, SmolLM2's) are one tensor, streamed under both names: vLLM
    reloads its head only when lm_head.weight arrives (without it the head stays as it was, test_vllm_engine.py)."""
    model = tiny(family).model
    model.lm_head.weight = model.get_input_embeddings().weight
    want = model.state_dict()
    assert "lm_head.weight" in want
    assert_same(streamed(model), dict(want), family)
    assert [s.name for s in PolicyWeights(model).specs()] == list(want)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3", "internvl"])
def test_lora_parts_equal_peft_merge_base_and_saved_adapter(family):
    from peft import get_peft_model_state_dict

    base_state = {k: v.clone() for k, v in tiny(family).model.state_dict().items()}
    adapter = with_lora(family, seed=3)
    model = adapter.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert PolicyWeights(model).has_lora

    merged = streamed(model, "merged")
    want = peft_merged_state(model)
    assert_same(merged, want, f"{family} merged")
    # the deltas are really in: a LoRA target's merged weight is not its base weight
    targets = [checkpoint_name(n) for n, _ in model.named_parameters() if n.endswith("q_proj.base_layer.weight")]
    assert targets and all(not torch.equal(dict(merged)[n], base_state[n]) for n in targets)
    # streaming never merged in place: every parameter of the policy is bitwise what it was
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), before[name]), f"{name} changed by streaming"

    assert_same(streamed(model, "base"), base_state, f"{family} base")
    adapter_state = get_peft_model_state_dict(model)
    assert_same(streamed(model, "adapter"), dict(adapter_state), f"{family} adapter")


@pytest.mark.parametrize(("family", "pattern", "module"), [
    ("qwen2_5_vl", r"visual\.merger\.mlp\.2\.", "model.visual.merger.mlp.2"),
    ("idefics3", r"connector\.modality_projection", "model.connector.modality_projection.proj"),
])
def test_a_module_trained_whole_is_streamed_under_its_own_name_once(family, pattern, module):
    adapter = with_lora(family, seed=5, train_fully=[pattern])
    model = adapter.model
    original = tiny(family).model.state_dict()[f"{module}.weight"].clone()
    with torch.no_grad():  # the trained copy moves away from the original
        copies = [p for n, p in model.named_parameters() if f"{module}.modules_to_save." in n and n.endswith("weight")]
        assert len(copies) == 1
        copies[0].add_(0.5)
    trained = copies[0].detach().clone()

    for part in ("merged", "base"):
        items = streamed(model, part)
        names = [n for n, _ in items]
        assert not any("modules_to_save" in n or "original_module" in n for n in names), part
        assert names.count(f"{module}.weight") == 1, part
        value = dict(items)[f"{module}.weight"]
        assert torch.equal(value, trained) and not torch.equal(value, original), part
    assert_same(streamed(model, "merged"), peft_merged_state(model), f"{family} merged with modules_to_save")


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe"])
def test_expert_lora_is_merged_under_checkpoint_names(family):
    """A mixture-of-experts model gets LoRA on its 3-D expert tensors (peft's target_parameters, one wrapper per
    tensor, nested); lora_sync sends such an adapter merged, so the merged stream must carry the experts' deltas under
    the checkpoint's names, as peft's own merge does."""
    adapter = with_lora(family, seed=7)
    model = adapter.model
    assert any("experts" in n and "lora_B" in n for n, _ in model.named_parameters())
    want = peft_merged_state(model)
    assert_same(streamed(model, "merged"), want, f"{family} merged")


def test_specs_match_the_stream_for_every_part_in_float32_and_bfloat16():
    cases = [with_lora("qwen2_5_vl", seed=1), with_lora("internvl", seed=2)]
    half = with_lora("idefics3", seed=4)
    half.model.to(torch.bfloat16)
    cases.append(half)
    cases.append(tiny("hybrid_llava"))
    dtypes = set()
    for adapter in cases:
        weights = PolicyWeights(adapter.model)
        for part in PARTS:
            specs = [(s.name, s.shape, s.dtype) for s in weights.specs(part)]
            items = [(n, tuple(t.shape), t.dtype) for n, t in weights.stream(part)]
            assert specs == items, (adapter.family, part)
            dtypes |= {d for _, _, d in specs}
        assert weights.specs("adapter") or adapter.family == "hybrid_llava"
    assert torch.bfloat16 in dtypes and torch.float32 in dtypes


def test_unknown_part_is_refused():
    with pytest.raises(ValueError, match="merged"):
        list(PolicyWeights(tiny("qwen2_5_vl").model).stream("everything"))


@pytest.fixture(scope="module")
def qlora():
    """A tiny Qwen2.5-VL loaded in 4 bit (bitsandbytes NF4 on the CPU) with random LoRA on its language model, and
    the plain twin's tensor shapes."""
    pytest.importorskip("bitsandbytes")
    from vlm_grpo.loader import load_model

    adapter = load_model("tiny:qwen2_5_vl", load_in_4bit=True, device="cpu", decide_cache=False)
    torch.manual_seed(0)
    apply_lora(adapter, LoraSettings(r=4, alpha=8, load_in_4bit=True))
    randomize_lora(adapter.model, 0)
    plain = {k: tuple(v.shape) for k, v in tiny("qwen2_5_vl").model.state_dict().items()}
    return adapter, plain


def _four_bit(model) -> dict[str, torch.nn.Module]:
    import bitsandbytes as bnb

    return {checkpoint_name(f"{n}.weight"): m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def test_4bit_lora_base_is_streamed_dequantized_as_its_specs_say(qlora):
    """QLoRA: a LoRA layer's 4-bit base is sent dequantized (as the policy computes with it), and what `specs`
    announces (a receiver allocates from it) is what the stream yields."""
    from bitsandbytes.functional import dequantize_4bit

    adapter, plain = qlora
    weights = PolicyWeights(adapter.model)
    under_lora = {checkpoint_name(n.removesuffix(".base_layer")) + ".weight"
                  for n, _ in adapter.model.named_modules() if n.endswith(".base_layer")}
    quantized = {n: m for n, m in _four_bit(adapter.model).items() if n in under_lora}
    assert quantized
    base = dict(weights.stream("base"))
    for name, module in quantized.items():
        assert base[name].shape == plain[name], name
        assert torch.equal(base[name], dequantize_4bit(module.weight.data, module.weight.quant_state)), name
    merged = dict(weights.stream("merged"))
    layers = {checkpoint_name(n) + ".weight": m for n, m in adapter.model.named_modules()
              if hasattr(m, "lora_A") and hasattr(m, "base_layer")}
    for name in quantized:  # the base dequantized plus B @ A times alpha / r
        layer = layers[name]
        delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]
        torch.testing.assert_close(merged[name], base[name] + delta.detach(), rtol=0, atol=1e-6)
    for part in ("base", "merged"):
        specs = [(s.name, s.shape, s.dtype) for s in weights.specs(part)]
        items = [(n, tuple(t.shape), t.dtype) for n, t in weights.stream(part)]
        assert specs == items, (part, [(s, i) for s, i in zip(specs, items) if s != i][:2])


def test_4bit_layers_without_lora_are_streamed_dequantized(qlora):
    """A 4-bit layer LoRA does not wrap (the vision tower's here) is sent dequantized too, never as packed bytes:
    every streamed tensor has the plain model's shape and a floating dtype."""
    adapter, plain = qlora
    weights = PolicyWeights(adapter.model)
    assert any(".visual." in n for n in _four_bit(adapter.model))
    for part in ("base", "merged"):
        items = list(weights.stream(part))
        shapes = {n: tuple(t.shape) for n, t in items}
        assert shapes == plain, (part, [(n, shapes[n], plain.get(n)) for n in shapes if shapes[n] != plain.get(n)][:3])
        assert all(t.is_floating_point() for _, t in items), part


# ------------------------------------------------------------------------------------ names, signature, config
def test_checkpoint_names_of_peft_wrapped_parameters():
    assert checkpoint_name("base_model.model.model.layers.0.q_proj.base_layer.weight") == "model.layers.0.q_proj.weight"
    assert checkpoint_name("base_model.model.lm_head.weight") == "lm_head.weight"
    assert checkpoint_name("model.norm.weight") == "model.norm.weight"
    assert checkpoint_name("base_model.model.model.visual.merger.mlp.2.modules_to_save.default.bias") == \
        "model.visual.merger.mlp.2.bias"


def test_checkpoint_name_of_nested_wrappers():
    """peft nests one wrapper per targeted tensor of a module (two expert tensors: base_layer.base_layer)."""
    assert checkpoint_name("base_model.model.model.layers.0.mlp.experts.base_layer.base_layer.gate_up_proj") == \
        "model.layers.0.mlp.experts.gate_up_proj"


def test_pushed_weights_are_copies_and_the_signature_follows_names_and_shapes():
    adapter = with_lora("qwen2_5_vl", seed=9)
    items = pushed_weights(adapter.model)
    assert [n for n, _ in items] == list(peft_merged_state(adapter.model))
    name, tensor = items[0]
    kept = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    tensor.add_(1.0)  # a copy: the policy does not move
    assert not torch.equal(tensor, dict(pushed_weights(adapter.model))[name])

    plain = tiny("qwen2_5_vl").model
    assert model_signature(adapter.model) == model_signature(plain)  # LoRA pushes the plain model's tensors
    assert model_signature(plain) != model_signature(tiny("idefics3").model)
    config = copy.deepcopy(plain.config)
    config.text_config.intermediate_size = plain.config.text_config.intermediate_size + 32
    wider = type(plain)(config)
    assert model_signature(wider) != model_signature(plain)
    assert all(torch.equal(v, kept[k]) for k, v in adapter.model.state_dict().items())


def test_export_config_writes_the_architecture_and_no_weights(tmp_path):
    from transformers import AutoConfig

    adapter = with_lora("idefics3", seed=0)
    export_config(adapter, tmp_path)
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.bin"))
    config = AutoConfig.from_pretrained(tmp_path)
    base = adapter.model.get_base_model()
    assert config.architectures == [type(base).__name__]
    assert config.model_type == base.config.model_type
    assert (tmp_path / "generation_config.json").is_file()
    assert list(tmp_path.glob("*token*"))  # the processor's tokenizer travels (with its chat template)


# ---------------------------------------------------------------------------------------------- an adapter file
def _logits(adapter, model) -> torch.Tensor:
    batch = adapter.encode_prompts([user_turn(1, "How many red squares?"), user_turn(1, "Count the blue squares.")],
                                   [[picture(56, 56, 1)], [picture(84, 56, 4)]])
    with torch.no_grad():
        return model(**adapter.model_inputs(batch)).logits


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft asks transformers
@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl"])
def test_written_adapter_loads_in_peft_with_the_policys_logits(family, tmp_path):
    from peft import PeftModel

    adapter = with_lora(family, seed=11)
    plan = plan_lora(adapter, "auto", True)
    assert plan.adapter_only, plan.reason
    write_adapter(tmp_path / "adapter", plan.config, PolicyWeights(adapter.model).stream("adapter"))
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4

    fresh = tiny(family)
    with torch.no_grad():
        without = _logits(fresh, fresh.model)
    loaded = PeftModel.from_pretrained(fresh.model, tmp_path / "adapter")
    loaded.eval()
    adapter.model.eval()
    policy = _logits(adapter, adapter.model)
    again = _logits(fresh, loaded)
    assert (policy - without).abs().max() > 1e-3  # the adapter changes the logits: the comparison is not blind
    torch.testing.assert_close(again, policy, rtol=0, atol=1e-5)


def test_an_adapter_push_without_tensors_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no LoRA tensor"):
        write_adapter(tmp_path, {"r": 4}, iter(()))


def test_adapter_versions_replace_each_other_and_a_new_base_clears_them(tmp_path):
    """One adapter held at a time, each version newer than the last; a whole-model push clears them, so a trainer
    that starts again (a resume, a second run against one server) numbers its adapters from 1."""
    from types import SimpleNamespace

    from vlm_grpo.grpo.rollout.vllm.lora_sync import AdapterVersions

    removed = []
    versions = AdapterVersions(tmp_path, remove_lora=removed.append,
                               request_class=lambda name, i, path: SimpleNamespace(lora_int_id=i, lora_path=path))
    matrix = [("base_model.model.q.lora_A.weight", torch.ones(2, 4))]
    versions.add({"r": 2}, matrix)
    second = versions.add({"r": 2}, matrix)
    assert second.lora_int_id == 2 and removed == [1] and versions.request(2) is second
    assert not (tmp_path / "adapter-1").exists() and (tmp_path / "adapter-2").exists()
    with pytest.raises(ValueError, match="not newer than the engine's 2"):
        versions.add({"r": 2}, matrix, version=2)
    with pytest.raises(ValueError, match="is not the engine's"):
        versions.request(1)
    versions.clear()
    assert removed == [1, 2] and versions.current is None and not (tmp_path / "adapter-2").exists()
    assert versions.request(None) is None
    assert versions.add({"r": 2}, matrix, version=1).lora_int_id == 1


# ---------------------------------------------------------------------------------------------- FSDP2
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def sharded_report(tmp_path_factory):
    """One torchrun launch of 2 CPU processes (gloo) running every sharded check (vllm_weights_worker.py)."""
    out = tmp_path_factory.mktemp("sharded") / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(WORKER), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


def test_sharded_stream_equals_the_unsharded_models_tensors(sharded_report):
    cases = sharded_report["cases"]
    assert {c["name"] for c in cases} == {"qwen2_5_vl", "internvl+lora", "idefics3+lora+bf16"}
    for case in cases:
        assert case["units"] >= 3, case  # the root and the blocks: the stream had several units to walk
        # each part compared tensor by tensor on both ranks (the adapter part is empty without LoRA)
        assert case["compared"]["merged"] > 0 and case["compared"]["base"] > 0, case
        assert (case["compared"]["adapter"] > 0) == ("lora" in case["name"]), case
        assert case["mismatches"] == [], case


def test_sharded_stream_gathers_one_shard_unit_at_a_time(sharded_report):
    for case in sharded_report["cases"]:
        assert case["unshard_calls"] >= case["units"], case  # every unit was gathered
        assert case["most_unsharded_by_calls"] == 1, case
        assert case["most_unsharded_seen"] == 1, case  # measured from the parameters at every yielded tensor
        assert case["unsharded_after"] == 0, case  # all resharded when the stream ends
        assert case["unsharded_after_abandoning"] == 0, case  # or when its consumer stops early
        assert case["control_seen"] == case["control_by_calls"] == case["units"], case  # the counts are not blind
