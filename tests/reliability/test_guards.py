"""Unstable training is caught: non-finite updates are skipped and stop the run; a KL spike warns or stops."""

from __future__ import annotations

import logging

import pytest
import torch

from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.guards.protocol import TrainingHalted
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false",
        "--log-completions", "false", "--model", "tiny:qwen2_5_vl"]


class Injecting(GRPOTrainer):
    """Runs a callback before chosen steps, to inject faults from outside the loop."""

    before_step: dict = {}

    def train_step(self, step):
        if step in self.before_step:
            self.before_step[step](self)
        return super().train_step(step)


def nan_logits(trainer):
    def hook(_module, _inputs, output):
        return output * float("nan") if torch.is_grad_enabled() else output  # only the policy forward

    trainer.adapter.model.get_output_embeddings().register_forward_hook(hook)


def test_nan_updates_are_skipped_then_the_run_stops(tmp_path):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--max-steps", "6", "--max-nonfinite-steps", "2",
                                 "--learning-rate", "1e-3", *FAST])
    Injecting.before_step = {2: nan_logits}
    trainer = Injecting.from_settings(cfg)
    weights = {}

    def remember(t):
        weights.update({n: p.detach().clone() for n, p in t.adapter.model.named_parameters()})
        nan_logits(t)

    Injecting.before_step = {2: remember}
    with pytest.raises(TrainingHalted, match="2 consecutive steps had a non-finite loss or gradient"):
        trained(trainer)
    after = dict(trainer.adapter.model.named_parameters())
    assert all(torch.equal(weights[n], after[n]) for n in weights)  # the skipped updates touched nothing
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # steps 1-2 fine, 3-4 skipped, then stopped
    assert not (tmp_path / "final").exists()


def test_one_nan_step_is_skipped_and_training_goes_on(tmp_path):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--max-steps", "4", "--learning-rate", "1e-3", *FAST])

    def once(t):
        handle = {}

        def hook(_m, _i, output):
            handle["h"].remove()
            return output * float("nan")

        handle["h"] = t.adapter.model.get_output_embeddings().register_forward_hook(
            lambda m, i, o: hook(m, i, o) if torch.is_grad_enabled() else o
        )

    Injecting.before_step = {1: once}
    history = trained(Injecting.from_settings(cfg))
    assert [m["skipped_updates"] for m in history] == [0, 1, 0, 0]
    assert (tmp_path / "final").is_dir()


def blow_up(trainer):
    with torch.no_grad():
        for p in trainer.adapter.model.get_output_embeddings().parameters():
            p.add_(torch.randn_like(p) * 5.0)


@pytest.mark.parametrize("action", ["warn", "stop"])
def test_kl_spike_watchdog(tmp_path, caplog, action):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--max-steps", "6", "--beta", "0.04", "--save-every", "1",
                                 "--learning-rate", "1e-4", "--kl-spike-action", action, *FAST])
    Injecting.before_step = {4: blow_up}
    trainer = Injecting.from_settings(cfg)
    with caplog.at_level(logging.WARNING):
        if action == "stop":
            with pytest.raises(TrainingHalted, match="KL spike: step 5"):
                trained(trainer)
        else:
            trained(trainer)
    assert "KL spike: step 5" in caplog.text
    checkpoints = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    if action == "stop":
        assert checkpoints[-1] == "checkpoint-4" and not (tmp_path / "final").exists()  # the last good state
    else:
        assert (tmp_path / "final").is_dir()


def test_a_raising_reward_stops_the_run_naming_it_or_scores_zero(tmp_path):
    base = ["--max-steps", "3", "--data.rewards", "digits=tests.grpo.toy_rewards:fails_on_digits", *FAST,
            "--max-new-tokens", "16", "--num-generations", "8"]
    from vlm_grpo.grpo.rewards.weighted import RewardError

    with pytest.raises(RewardError, match=r"reward 'digits' \(fails_on_digits at .*toy_rewards.py:\d+\) raised ValueError: cannot parse.* on completion \d+ .*, dataset row \d+, step \d+"):
        trained(GRPOTrainer.from_settings(load_config(overrides=[*base, "--output-dir", str(tmp_path / "raise")])))
    history = trained(GRPOTrainer.from_settings(load_config(overrides=[*base, "--output-dir", str(tmp_path / "zero"), "--on-reward-error", "zero"])))
    errors = sum(m["reward_errors/digits"] for m in history)
    assert errors > 0 and (tmp_path / "zero" / "final").is_dir()
