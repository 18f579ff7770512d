"""LoRA / QLoRA on every family's tiny twin: language-only default targets, the reference policy as
the disabled adapter, merging. Each test builds fresh twins (the conftest ones are shared)."""

from __future__ import annotations

import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters.registry import family_class, image_families
from vlm_grpo.grpo.logprobs.completions import completion_logprobs
from vlm_grpo.grpo.training.lora import (
    DEFAULT_TARGETS,
    MLP_PROJECTIONS,
    apply_lora,
    is_lora_wrapped,
    lora_target_parameters,
    lora_targets,
    merged_copy,
    reference_disabled,
)
from vlm_grpo.grpo.settings.sections import LoraSettings, OptimConfig
from vlm_grpo.adapters.freeze import is_lora_param
from vlm_grpo.grpo.training.optimizer import build_optimizer, param_groups

ALL_FAMILIES = sorted(image_families())


def fresh(family: str):
    return family_class(family).tiny(seed=0)


def encode(adapter):
    return adapter.encode_prompts(
        [user_turn(1, "How many red squares?"), user_turn(1, "Count the blue squares.")],
        [[picture(56, 56, 1)], [picture(84, 56, 4)]],
    )


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_default_targets_are_the_language_projections_only(family):
    adapter = fresh(family)
    targets = lora_targets(adapter, LoraSettings(r=4))
    assert targets and all(adapter.module_group_of(t + ".weight") == "language" for t in targets)
    tensors = lora_target_parameters(adapter, LoraSettings(r=4))
    if adapter.module_layout.experts:  # MoE: the MLP projections are the experts' 3-D tensors
        assert tensors and all(adapter.training_group_of(t) == "experts" and t.endswith("_proj") for t in tensors)
        assert {t.rsplit(".", 1)[-1] for t in targets} >= {"q_proj", "k_proj", "v_proj", "o_proj"}
    else:
        assert not tensors
        names = {t.rsplit(".", 1)[-1] for t in targets}
        assert names <= set(DEFAULT_TARGETS) and {"q_proj", "k_proj", "v_proj"} <= names
        assert names & {"o_proj", "out_proj"} and len(names & set(MLP_PROJECTIONS)) >= 2  # output; gate/up + down
    assert any(t.endswith("self_attn.q_proj") for t in targets) and any(t.endswith("self_attn.v_proj") for t in targets)


def test_vision_towers_share_the_names_so_a_suffix_list_would_be_wrong():
    # the check above is not blind: these vision towers hold q_proj/v_proj (or gate/up/down) Linears too
    for family in ("internvl", "hybrid_llava", "idefics3", "qwen2_5_vl"):
        adapter = fresh(family)
        vision = [
            n for n, m in adapter.model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in DEFAULT_TARGETS
            and adapter.module_group_of(n + ".weight") == "vision"
        ]
        assert vision, family
        assert not set(vision) & set(lora_targets(adapter, LoraSettings(r=4))), family


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_lora_trains_only_adapters_and_keeps_the_base_as_reference(family):
    adapter = fresh(family)
    batch = encode(adapter)
    out = adapter.generate(batch, max_new_tokens=4, min_new_tokens=4, use_cache=False)
    completion = out.sequences[:, batch.input_ids.shape[1]:]
    mask = torch.ones_like(completion)
    with torch.no_grad():
        original = completion_logprobs(adapter, batch, completion, mask)
    base_class = type(adapter.model)

    assert apply_lora(adapter, LoraSettings(r=4, alpha=8)) is adapter
    assert is_lora_wrapped(adapter)
    groups = {n: adapter.module_group_of(n) for n, _ in adapter.model.named_parameters()}  # every name maps
    assert {g for n, g in groups.items() if is_lora_param(n)} == {"language"}
    trainable = {n for n, p in adapter.model.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n in groups if is_lora_param(n)}

    optimizer = build_optimizer(adapter, OptimConfig(learning_rate=1e-2))
    assert [g["name"] for g in optimizer.param_groups] == ["language"] + (["experts"] if adapter.module_layout.experts else [])
    before = {n: p.detach().clone() for n, p in adapter.model.named_parameters()}
    for _ in range(2):  # B starts at zero, so A only moves from the second step on
        (-completion_logprobs(adapter, batch, completion, mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for name, param in adapter.model.named_parameters():
        assert torch.equal(param, before[name]) != (name in trainable), name

    with torch.no_grad():
        enabled = completion_logprobs(adapter, batch, completion, mask)
        with reference_disabled(adapter) as ref:
            disabled = completion_logprobs(ref, batch, completion, mask)
        again = completion_logprobs(adapter, batch, completion, mask)
    assert (disabled - original).abs().max().item() <= 1e-6
    assert (enabled - original).abs().max().item() > 1e-3
    assert torch.equal(again, enabled)  # the adapter is back on after the block

    regenerated = adapter.generate(batch, max_new_tokens=3)
    assert regenerated.sequences.shape[0] == len(batch)

    merged = merged_copy(adapter)
    assert type(merged) is base_class
    assert not any(is_lora_param(n) for n, _ in merged.named_parameters())
    assert is_lora_wrapped(adapter)  # merging worked on a copy
    inputs = adapter.completion_inputs(batch, completion, mask)
    with torch.no_grad():
        diff = (merged(**inputs).logits - adapter.model(**inputs).logits).abs().max().item()
    assert diff <= 1e-5


def test_explicit_targets_freeze_interplay_and_misuse():
    adapter = fresh("qwen2_5_vl")
    assert apply_lora(adapter, LoraSettings(r=0)).model is adapter.model and not is_lora_wrapped(adapter)
    with pytest.raises(ValueError, match="needs a LoRA-wrapped model"):
        with reference_disabled(adapter):
            pass
    with pytest.raises(ValueError, match=r"\['no_such'\] match no Linear"):
        lora_targets(adapter, LoraSettings(r=4, target_modules=["q_proj", "no_such"]))
    targets = LoraSettings(r=4, target_modules=["merger.mlp.2", "language_model.layers.0.self_attn.q_proj"])
    with pytest.raises(ValueError, match="choose one"):  # LoRA matrices and trained whole: contradictory
        apply_lora(fresh("qwen2_5_vl"), targets, train_fully=[r"merger\.mlp\.2\."])
    apply_lora(adapter, targets, train_fully=[r"^lm_head\."])
    lora_groups = {adapter.module_group_of(n) for n, _ in adapter.model.named_parameters() if is_lora_param(n)}
    assert lora_groups == {"projector", "language"}
    with pytest.raises(ValueError, match="already carries LoRA"):
        apply_lora(adapter, LoraSettings(r=4))
    # freeze policies still apply after wrapping: freeze language LoRA, train the lm_head whole (as a copy)
    cfg = OptimConfig(freeze=["language"], trainable_patterns=[r"^lm_head\."])
    optimizer = build_optimizer(adapter, cfg)
    assert [g["name"] for g in optimizer.param_groups] == ["projector", "head"]
    assert [g["name"] for g in param_groups(adapter, cfg)] == ["projector", "head"]
    heads = {n: p.requires_grad for n, p in adapter.model.named_parameters() if "lm_head" in n}
    assert any(v for n, v in heads.items() if "modules_to_save" in n)
    assert not any(v for n, v in heads.items() if "original_module" in n)  # the reference's lm_head stays
    # a base module trained in place under LoRA would move the reference and miss the adapter checkpoint
    plain = fresh("qwen2_5_vl")
    apply_lora(plain, LoraSettings(r=4))
    with pytest.raises(ValueError, match="trainable copy"):
        build_optimizer(plain, OptimConfig(trainable_patterns=[r"^lm_head\."]))
