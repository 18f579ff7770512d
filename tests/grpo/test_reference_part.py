"""The KL term's reference, decided in one place (grpo/parts/reference.py): none at beta 0; under LoRA the policy
with its adapters switched off; otherwise a frozen copy, which loss.sync_ref_model moves toward the policy."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_adapter
from vlm_grpo.grpo.algorithm.losses import LossConfig
from vlm_grpo.grpo.parts.reference import Reference
from vlm_grpo.grpo.settings.sections import LoraSettings
from vlm_grpo.grpo.training.lora import apply_lora


@pytest.fixture(scope="module")
def plain():
    return copy.deepcopy(tiny_adapter("smolvlm"))


@pytest.fixture(scope="module")
def with_lora(plain):
    adapter = copy.deepcopy(plain)
    apply_lora(adapter, LoraSettings(r=2))
    return adapter


def lora_layers_off(model) -> list[bool]:
    return [m.disable_adapters for m in model.modules() if hasattr(m, "lora_A")]


@pytest.mark.parametrize("beta, lora, needed, copied", [
    (0.0, False, False, False),  # no KL term: nothing runs a reference forward
    (0.0, True, False, False),
    (0.04, False, True, True),  # a frozen in-memory copy of the policy
    (0.04, True, True, False),  # LoRA's base: the policy with its adapters off
])
def test_one_rule_decides_the_reference(plain, with_lora, beta, lora, needed, copied):
    adapter = with_lora if lora else plain
    ref = Reference(LossConfig(beta=beta), adapter)
    assert ref.needed is needed and (ref.model is not None) is copied and len(ref.models()) == int(copied)
    if not needed:
        return
    with ref.weights(adapter.model) as model:
        if copied:
            assert model is ref.model and model is not adapter.model and not model.training
            assert not any(p.requires_grad for p in model.parameters())
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), adapter.model.parameters()))
        else:
            assert model is adapter.model and lora_layers_off(model) and all(lora_layers_off(model))
    if lora:
        assert not any(lora_layers_off(adapter.model))  # LoRA is back on after the reference's forward


def test_sync_moves_the_copy_when_due_and_refuses_sharding(plain):
    cfg = LossConfig(beta=0.04, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5)
    ref = Reference(cfg, plain)
    policy = copy.deepcopy(plain.model)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    before = [p.clone() for p in ref.model.parameters()]
    ref.after_update(1, policy)  # not due
    assert all(torch.equal(p, q) for p, q in zip(ref.model.parameters(), before))
    ref.after_update(2, policy)  # due: halfway toward the policy
    assert all(torch.allclose(p, q + 0.5) for p, q in zip(ref.model.parameters(), before))
    with pytest.raises(ValueError, match="loss.sync_ref_model with FSDP"):
        ref.shard("full_shard")
