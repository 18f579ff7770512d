"""Mixture-of-experts language models (the qwen3_vl_moe tiny twin: 4 experts, 2 per token): the routers'
load-balancing loss joins the GRPO loss as TRL adds it, the experts are a sub-group for freezing and learning
rates, and LoRA reaches the experts' 3-D tensors."""

from __future__ import annotations

import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.grpo.parts import sampler as sampler_module
from vlm_grpo.grpo.parts import trained_policy as update_module  # where the update step is called
from vlm_grpo.grpo.rollout.generation import rollout
from vlm_grpo.grpo.settings.sections import LoraSettings, OptimConfig
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.adapters.freeze import apply_freeze
from vlm_grpo.grpo.training.lora import apply_lora, lora_target_parameters
from vlm_grpo.grpo.training.optimizer import build_optimizer, trainable_table
from tests.trained import trained

MOE = "qwen3_vl_moe"


def fresh(family: str = MOE):
    return family_class(family).tiny(seed=0)


def one_step_gradients(tmp_path, coef: str, monkeypatch):
    """The gradients of one GRPO step (before the update) and the rollout it scored."""
    seen: dict = {}

    def record_update(accelerator, optimizer, cfg):
        seen["grads"] = {id(p): p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]
                         if p.grad is not None}
        return torch.tensor(0.0), True  # skip the update: only the gradients matter

    def record_rollout(*args, **kwargs):
        seen["rollout"] = rollout(*args, **kwargs)
        return seen["rollout"]

    monkeypatch.setattr(update_module, "update_step", record_update)
    monkeypatch.setattr(sampler_module, "rollout", record_rollout)
    cfg = load_config(overrides=[
        "--model", f"tiny:{MOE}", "--output-dir", str(tmp_path / coef), "--max-steps", "1", "--max-new-tokens", "4",
        "--batch-size", "1", "--num-generations", "2", "--logging.progress", "false", "--data.recipe_options",
        "{image_size: 56}", "--router-aux-loss-coef", coef,
    ])
    trainer = GRPOTrainer.from_settings(cfg)
    metrics = trained(trainer)[0]
    names = {id(p): n for n, p in trainer.adapter.model.named_parameters()}
    return {names[k]: v for k, v in seen["grads"].items()}, seen["rollout"], trainer, metrics


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")  # the recorded update skips the step
def test_router_aux_loss_adds_exactly_coef_times_its_gradient(tmp_path, monkeypatch):
    coef = 0.5
    with_aux, ro, trainer, metrics = one_step_gradients(tmp_path, str(coef), monkeypatch)
    without, ro_plain, _, plain_metrics = one_step_gradients(tmp_path, "0", monkeypatch)
    assert torch.equal(ro.completion_ids, ro_plain.completion_ids)  # the same step, scored twice
    assert "aux_loss" in metrics and "aux_loss" not in plain_metrics

    # reference: the model's own load-balancing loss from one plain forward (pixels, not shared features) over
    # the same prompt + completion rows, differentiated on its own
    adapter = trainer.adapter
    model = adapter.model
    model.zero_grad(set_to_none=True)
    rows = ro.prompts.select(ro.prompt_index(list(range(len(ro.completion_ids)))))
    inputs = adapter.completion_inputs(rows, ro.completion_ids, ro.completion_mask)
    aux = model(**inputs, output_router_logits=True, use_cache=False).aux_loss
    assert aux.item() == pytest.approx(metrics["aux_loss"], rel=1e-5)
    aux.backward()
    reference = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    routers = [n for n in with_aux if n.endswith("mlp.gate.weight")]
    assert routers and all(reference[n].abs().max() > 0 for n in routers)  # the check can fail
    for name, grad in with_aux.items():
        expected = coef * reference[name] if name in reference else torch.zeros_like(grad)
        if name in without:
            expected = expected + without[name]
        assert torch.allclose(grad, expected, rtol=1e-4, atol=1e-7), name


def test_router_aux_loss_coef_needs_routers(tmp_path):
    cfg = load_config(overrides=["--model", "tiny:qwen2_5_vl", "--output-dir", str(tmp_path), "--max-steps", "1",
                                 "--router-aux-loss-coef", "0.01", "--logging.progress", "false"])
    with pytest.raises(ValueError, match="qwen2_5_vl is not a mixture-of-experts model"):
        GRPOTrainer.from_settings(cfg)
    assert fresh().router_aux_loss_coef() == 0.001  # unset: the config's own coefficient, as TRL
    assert fresh().router_aux_loss_coef(0.0) == 0.0


def test_experts_are_a_sub_group_of_language():
    adapter = fresh()
    groups = adapter.module_groups()  # the four groups: every parameter in exactly one
    experts = [n for n, _ in adapter.model.named_parameters() if adapter.training_group_of(n) == "experts"]
    assert experts and set(experts) < set(groups["language"])
    assert {n.split(".mlp.")[1].split(".")[0] for n in experts} == {"experts", "gate"}

    apply_freeze(adapter, OptimConfig(freeze=["experts"]))
    frozen = {n for n, p in adapter.model.named_parameters() if not p.requires_grad}
    assert frozen == set(experts)
    apply_freeze(adapter, OptimConfig(freeze=["language"]))  # a group freezes its sub-group
    assert {n for n, p in adapter.model.named_parameters() if not p.requires_grad} == set(groups["language"])

    optimizer = build_optimizer(adapter, OptimConfig(learning_rate=1e-3, language_lr=2e-3, experts_lr=5e-4))
    lrs = {g["name"]: (g["lr"], len(g["params"])) for g in optimizer.param_groups}
    assert lrs["experts"] == (5e-4, len(experts)) and lrs["language"][0] == 2e-3
    plain = build_optimizer(fresh(), OptimConfig(learning_rate=1e-3, language_lr=2e-3))
    assert {g["name"]: g["lr"] for g in plain.param_groups}["experts"] == 2e-3  # unset: the language model's
    assert "  experts" in trainable_table(adapter, OptimConfig(experts_lr=5e-4))


def test_experts_settings_on_a_dense_model_are_refused():
    dense = fresh("qwen2_5_vl")
    with pytest.raises(ValueError, match=r"freeze names \['experts'\], but qwen2_5_vl has no such parameters"):
        apply_freeze(dense, OptimConfig(freeze=["experts"]))
    with pytest.raises(ValueError, match="experts_lr is set, but qwen2_5_vl is not a mixture-of-experts model"):
        build_optimizer(dense, OptimConfig(experts_lr=1e-4))


def test_lora_on_named_expert_tensors_trains_them():
    adapter = fresh()
    settings = LoraSettings(r=2, target_modules=["experts.down_proj"])  # the experts' tensors alone
    assert [t.rsplit(".", 1)[-1] for t in lora_target_parameters(adapter, settings)] == ["down_proj", "down_proj"]
    apply_lora(adapter, settings)
    batch = adapter.encode_prompts([user_turn(1, "How many red squares?")], [[picture(56, 56, 1)]])
    optimizer = build_optimizer(adapter, OptimConfig(learning_rate=1e-2))
    assert [g["name"] for g in optimizer.param_groups] == ["experts"]
    for _ in range(2):  # B starts at zero: A moves from the second step on
        adapter.model(**adapter.model_inputs(batch), use_cache=False).logits.sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad(), adapter.model.disable_adapter():
        base = adapter.model(**adapter.model_inputs(batch), use_cache=False).logits
    tuned = adapter.model(**adapter.model_inputs(batch), use_cache=False).logits
    assert (tuned - base).abs().max() > 1e-4
