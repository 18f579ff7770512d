"""An update that makes a weight NaN or inf is undone (weights and optimizer state as before it), counted, and stops
the run after guard.max_nonfinite_steps; without the copy it stops the run at once."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.guards.protocol import TrainingHalted
from vlm_grpo.grpo.guards.weight_guard import WeightGuard
from tests.reliability.test_guards import FAST, Injecting
from tests.trained import trained


def _model_and_optimizer(lr: float):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    groups = [{"name": "language", "params": [model.weight]}, {"name": "head", "params": [model.bias]}]
    return model, torch.optim.AdamW(groups, lr=lr)


def _step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).pow(2).sum().backward()
    optimizer.step()


def test_a_step_that_makes_weights_inf_is_undone_with_the_optimizer_state():
    model, optimizer = _model_and_optimizer(lr=1e-2)
    guard = WeightGuard(optimizer, keep_previous=True)
    _step(model, optimizer)
    assert guard.check(1) == {}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {k: v.clone() for k, v in optimizer.state[model.weight].items()}
    for group in optimizer.param_groups:
        group["lr"] = float("inf")  # what a learning rate far out of range does: every weight overflows
    _step(model, optimizer)
    assert not torch.isfinite(model.weight).all()
    bad = guard.check(2)
    assert set(bad) == {"language", "head"}
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert all(torch.equal(state[k], v) for k, v in optimizer.state[model.weight].items())


def test_the_first_step_undone_leaves_no_optimizer_state_and_large_finite_weights_pass():
    model, optimizer = _model_and_optimizer(lr=float("inf"))
    guard = WeightGuard(optimizer, keep_previous=True)
    with torch.no_grad():
        model.weight.fill_(1e20)  # a 2-norm would overflow float32: still finite weights
    assert guard.nonfinite_groups() == {}
    _step(model, optimizer)
    assert guard.check(1) and not optimizer.state
    assert torch.all(model.weight == 1e20)


def test_without_the_copy_a_bad_step_stops_at_once():
    model, optimizer = _model_and_optimizer(lr=float("inf"))
    guard = WeightGuard(optimizer, keep_previous=False)
    _step(model, optimizer)
    with pytest.raises(TrainingHalted, match=r"step 3: the update made weights non-finite in language \(largest "):
        guard.check(3)


def huge_learning_rate(trainer):
    for group in trainer.policy.optimizer.param_groups:
        group["lr"] = float("inf")  # past the settings' range check: the guard after the update must catch it


def test_a_run_undoes_weight_breaking_steps_counts_them_and_stops(tmp_path):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--max-steps", "4", "--max-nonfinite-steps", "2",
                                 "--save-every", "1", "--learning-rate", "1e-3", "--guard.undo_nonfinite_updates",
                                 "true", *FAST])
    kept = {}

    def remember(trainer):
        kept.update({n: p.detach().clone() for n, p in trainer.adapter.model.named_parameters()})
        huge_learning_rate(trainer)

    Injecting.before_step = {1: remember, 2: huge_learning_rate}  # the schedule sets the rate again each step
    trainer = Injecting.from_settings(cfg)
    with pytest.raises(TrainingHalted, match="2 consecutive steps had .* an update that made weights non-finite"):
        trained(trainer)
    Injecting.before_step = {}
    assert all(torch.equal(kept[n], p) for n, p in trainer.adapter.model.named_parameters())
    assert [m["undone_updates"] for m in trainer.history] == [0, 1, 1]
    assert all(torch.isfinite(p).all() for p in trainer.adapter.model.parameters())
    assert (tmp_path / "checkpoint-1").is_dir() and not (tmp_path / "final").exists()
    assert not (tmp_path / "checkpoint-3").exists()  # the stopping step is not saved: checkpoint-1 is the last good
