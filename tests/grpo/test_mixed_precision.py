"""Under an fp16 loss scaler, gradients are clipped unscaled and an overflow lowers the scale (its update skipped).

CPU has no native fp16 autocast, so the scaler accelerate keeps on a GPU is put in place by hand: a real
`torch.amp.GradScaler` driven by accelerate's own optimizer wrapper, exactly the GPU code path."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from vlm_grpo.grpo.settings.sections import OptimConfig
from vlm_grpo.grpo.training.optimizer import update_step


@pytest.fixture(autouse=True)
def fp16_reported(monkeypatch):
    # the accelerator's precision lives in a process-wide state that cannot be changed back: report fp16 from
    # the class for the length of a test instead
    monkeypatch.setattr(Accelerator, "mixed_precision", property(lambda self: "fp16"))


def _scaled_setup(init_scale: float = 2.0**10):
    acc = Accelerator(cpu=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    acc.scaler, acc.native_amp = scaler, True  # what fp16 on a GPU sets up; prepare hands it to the optimizer
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert optimizer.scaler is scaler
    return acc, model, optimizer, scaler


def test_gradients_are_clipped_after_unscaling():
    acc, model, optimizer, scaler = _scaled_setup()
    loss = model(torch.full((1, 4), 3.0)).sum()  # d loss / d w = 3 each: true norm 6
    scaler.scale(loss).backward()
    norm, skipped = update_step(acc, optimizer, OptimConfig(max_grad_norm=1.0))
    assert not skipped
    assert abs(norm.item() - 6.0) < 1e-4  # the true norm, not 6 x 2^10
    step = 1.0 - model.weight.detach()  # SGD lr 0.1 on the clipped gradient (norm 1)
    assert torch.allclose(step.norm(), torch.tensor(0.1), atol=1e-5)


def test_an_overflow_skips_the_update_and_lowers_the_scale():
    acc, model, optimizer, scaler = _scaled_setup()
    before = model.weight.detach().clone()
    scaler.scale(model(torch.full((1, 4), float("inf"))).sum()).backward()
    _, skipped = update_step(acc, optimizer, OptimConfig(max_grad_norm=1.0))
    assert skipped and torch.equal(model.weight.detach(), before)
    assert scaler.get_scale() == 2.0**9  # halved: the next steps can recover
    optimizer.zero_grad()
    scaler.scale(model(torch.ones(1, 4)).sum()).backward()
    _, skipped = update_step(acc, optimizer, OptimConfig(max_grad_norm=1.0))
    assert not skipped and not torch.equal(model.weight.detach(), before)
