"""Freeze policies, per-module learning rates and the schedule, on every family's tiny twin.

Each test builds its own fresh twin: the cached ones in tests/conftest.py are shared and must not
have their weights or requires_grad changed.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters.module_groups import GROUP_NAMES, MODULE_GROUPS, SUB_GROUPS
from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.twins.qwen2_5_vl import TINY_PIXELS, TINY_TEXT, TINY_VISION
from vlm_grpo.adapters.registry import family_class, image_families
from vlm_grpo.grpo.settings.sections import OptimConfig
from vlm_grpo.adapters.freeze import FREEZE_PRESETS, apply_freeze
from vlm_grpo.grpo.training.optimizer import (
    build_optimizer,
    build_scheduler,
    clip_gradients,
    param_groups,
    trainable_table,
)

ALL_FAMILIES = sorted(image_families())
LRS = dict(learning_rate=1e-3, vision_lr=1e-2, projector_lr=2e-2, language_lr=3e-2, head_lr=4e-2)


def fresh(family: str):
    return family_class(family).tiny(seed=0)


@functools.lru_cache(maxsize=None)
def prompt_batch(family: str):
    """One sample with one picture; encoding reads the processor only, so the batch can be shared."""
    return fresh(family).encode_prompts([user_turn(1, "How many red squares?")], [[picture(56, 56, 1)]])


def optimizer_groups(adapter, groups) -> list[str]:
    """The optimizer groups `groups` (module groups) make on `adapter`: the sub-groups it has ride along."""
    present = {adapter.training_group_of(n) for n, _ in adapter.model.named_parameters()}
    return [g for g in GROUP_NAMES if g in present and SUB_GROUPS.get(g, g) in groups]


def snapshot(adapter) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in adapter.model.named_parameters()}


def train_steps(adapter, optimizer, batch, steps: int = 2) -> None:
    for _ in range(steps):
        logits = adapter.model(**adapter.model_inputs(batch), use_cache=False).logits
        logits.float().sum().backward()
        clip_gradients(optimizer, OptimConfig(max_grad_norm=0.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    "frozen",
    [(), ("vision", "head"), ("projector", "language")],
    ids=["none", "vision+head", "projector+language"],
)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_steps_move_only_trainable_groups_at_their_lr(family, frozen):
    adapter = fresh(family)
    cfg = OptimConfig(freeze=list(frozen), **LRS)
    optimizer = build_optimizer(adapter, cfg)
    trainable = optimizer_groups(adapter, [g for g in MODULE_GROUPS if g not in frozen])
    assert [g["name"] for g in optimizer.param_groups] == trainable
    for group in optimizer.param_groups:  # a sub-group without its own learning rate takes its group's
        assert group["lr"] == LRS[f"{SUB_GROUPS.get(group['name'], group['name'])}_lr"], group["name"]
    before = snapshot(adapter)
    train_steps(adapter, optimizer, prompt_batch(family))
    for name, param in adapter.model.named_parameters():
        group = adapter.module_group_of(name)
        if group in frozen:
            assert not param.requires_grad, name
            assert torch.equal(param, before[name]), f"{name} ({group}) is frozen but changed"
        else:
            assert param.requires_grad, name
            assert not torch.equal(param, before[name]), f"{name} ({group}) is trainable but did not change"


def _expected_projector_and_early_lm(adapter, projector_linear: str, lm_layers: int) -> set[str]:
    names = [n for n, _ in adapter.model.named_parameters()]
    layers = {f"model.language_model.layers.{i}." for i in range(lm_layers)}
    return (
        {f"{projector_linear}.weight", f"{projector_linear}.bias", "model.language_model.embed_tokens.weight"}
        | {n for n in names if any(n.startswith(p) for p in layers)}
    )


@pytest.mark.parametrize("family", ["qwen2_5_vl", "hybrid"])
def test_projector_and_early_lm_preset_is_the_blog_posts_policy(family):
    adapter = fresh(family)
    apply_freeze(adapter, OptimConfig(freeze_preset="projector_and_early_lm"))
    trainable = {n for n, p in adapter.model.named_parameters() if p.requires_grad}
    n_layers = adapter.model.config.text_config.num_hidden_layers
    assert n_layers < 5  # the tiny twins are shallower than 5 layers: every decoder layer trains
    assert trainable == _expected_projector_and_early_lm(adapter, "model.visual.merger.mlp.2", n_layers)


def test_projector_and_early_lm_stops_after_five_language_layers():
    adapter = Qwen2_5_VLAdapter.build(Architecture(TINY_VISION, {**TINY_TEXT, "num_hidden_layers": 7}, TINY_PIXELS), seed=0)
    apply_freeze(adapter, OptimConfig(freeze_preset="projector_and_early_lm"))
    trainable = {n for n, p in adapter.model.named_parameters() if p.requires_grad}
    assert trainable == _expected_projector_and_early_lm(adapter, "model.visual.merger.mlp.2", 5)
    assert not any(".layers.5." in n or ".layers.6." in n for n in trainable)


def test_the_presets_earlier_name_is_read_as_the_new_one_with_a_warning(caplog):
    with caplog.at_level("WARNING"):
        assert OptimConfig(freeze_preset="seed_hybrid").freeze_preset == "projector_and_early_lm"
    assert "freeze preset 'seed_hybrid' is now called 'projector_and_early_lm'" in caplog.text


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_projector_and_early_lm_finds_projector_output_and_embedding_on_every_family(family):
    adapter = fresh(family)
    optimizer = build_optimizer(adapter, OptimConfig(freeze_preset="projector_and_early_lm"))
    assert [g["name"] for g in optimizer.param_groups] == optimizer_groups(adapter, ["projector", "language"])
    trainable = {n for n, p in adapter.model.named_parameters() if p.requires_grad}
    projector = {n for n in trainable if adapter.module_group_of(n) == "projector"}
    assert len({n.rsplit(".", 1)[0] for n in projector}) == 1, projector  # one Linear layer
    embed = adapter.model.get_input_embeddings().weight
    assert any(p is embed and p.requires_grad for p in adapter.model.parameters())
    before = snapshot(adapter)
    train_steps(adapter, optimizer, prompt_batch(family))
    for name, param in adapter.model.named_parameters():
        assert torch.equal(param, before[name]) != (name in trainable), name


def test_conveniences_and_trainable_patterns():
    adapter = fresh("qwen2_5_vl")
    apply_freeze(adapter, OptimConfig(freeze_preset="vision_frozen"))
    assert {g["name"] for g in param_groups(adapter, OptimConfig())} == {"projector", "language", "head"}
    cfg = OptimConfig(freeze_preset="lm_only", trainable_patterns=[r"^model\.visual\.blocks\.1\.mlp\."])
    apply_freeze(adapter, cfg)
    trainable = {n for n, p in adapter.model.named_parameters() if p.requires_grad}
    vision = {n for n in trainable if adapter.module_group_of(n) == "vision"}
    assert vision and all(n.startswith("model.visual.blocks.1.mlp.") for n in vision)
    assert not any(adapter.module_group_of(n) == "projector" for n in trainable)
    assert [g["name"] for g in param_groups(adapter, cfg)] == ["vision", "language", "head"]


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match=r"unknown module group.*'visoin'.*vision, projector, language, head"):
        OptimConfig(freeze=["visoin"])
    with pytest.raises(ValueError, match="known presets: " + ", ".join(sorted(FREEZE_PRESETS))):
        OptimConfig(freeze_preset="seed")
    with pytest.raises(ValueError, match="lr_scheduler"):
        OptimConfig(lr_scheduler="warp_speed")
    adapter = fresh("smolvlm")
    with pytest.raises(ValueError, match="match no parameter"):
        apply_freeze(adapter, OptimConfig(trainable_patterns=["no_such_module"]))
    with pytest.raises(ValueError, match="no trainable parameter"):
        build_optimizer(adapter, OptimConfig(freeze=list(MODULE_GROUPS)))


def test_scheduler_warms_up_every_group_keeping_its_ratio():
    adapter = fresh("internvl")
    cfg = OptimConfig(warmup_ratio=0.25, **LRS)
    optimizer = build_optimizer(adapter, cfg)
    scheduler = build_scheduler(optimizer, cfg, total_steps=8)  # ceil(0.25 * 8) = 2 warmup steps
    seen = []
    for _ in range(4):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    full = [LRS[f"{g['name']}_lr"] for g in optimizer.param_groups]
    assert seen[0] == [0.0] * 4
    assert seen[1] == pytest.approx([lr / 2 for lr in full])
    assert seen[2] == pytest.approx(full) and seen[3] == pytest.approx(full)
    linear = OptimConfig(lr_scheduler="linear", warmup_steps=1, warmup_ratio=0.9)  # warmup_steps wins
    optimizer = build_optimizer(adapter, linear)
    scheduler = build_scheduler(optimizer, linear, total_steps=5)
    lrs = []
    for _ in range(5):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[0] == pytest.approx(1e-5) and lrs[-1] == pytest.approx(0.0)


def test_trainable_table_has_a_row_per_group_and_a_total():
    adapter = fresh("idefics3")
    cfg = OptimConfig(freeze=["vision"], **LRS)
    apply_freeze(adapter, cfg)
    table = trainable_table(adapter, cfg)
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line and not line.startswith("-")}
    assert set(rows) == {"group", *MODULE_GROUPS, "total"}
    total = sum(p.numel() for p in adapter.model.parameters())
    trainable = sum(p.numel() for p in adapter.model.parameters() if p.requires_grad)
    assert rows["total"][1:3] == [f"{total:,}", f"{trainable:,}"]
    assert rows["vision"][2] == "0" and rows["vision"][-1] == "-"
    assert rows["head"][-1] == f"{LRS['head_lr']:.2e}"
    assert rows["projector"][-1] == f"{LRS['projector_lr']:.2e}"
