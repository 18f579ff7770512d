"""`loss.loss_type` and `advantage` take `package.module:Class`: a user's loss or estimator, imported from a file on
the Python path and checked against the documented base class; what cannot work is refused naming the setting."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES, reward_scores
from vlm_grpo.grpo.algorithm.losses import LOSSES, LossConfig, LossInputs, policy_loss
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config

USER_CODE = '''
import torch

from vlm_grpo.grpo.algorithm.advantages.base import AdvantageEstimator, reward_metrics
from vlm_grpo.grpo.algorithm.losses.base import PolicyLoss


class PlainPolicyGradient(PolicyLoss):
    """-ratio x advantage, the mean over the micro-batch's tokens."""
    name, summary, paper, normalisation = "plain_pg", "-ratio x A", "none", "tokens"

    def per_token(self, terms, cfg):
        return -terms.ratio * terms.advantages, {"plain_ratio": terms.ratio}


class Centred(AdvantageEstimator):
    """Reward minus the group's mean, unscaled (unscorable completions: 0)."""
    name, summary, paper = "centred", "r - mean", "none"

    def estimate(self, scores, mask, cfg):
        grouped = scores.total.view(-1, scores.num_generations)
        centred = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).nan_to_num(0.0)
        return centred.reshape(-1), reward_metrics(scores.total, scores.num_generations)


class NotALoss:
    pass


class WithSettings(PlainPolicyGradient):
    settings = {"plain_scale": None}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module file on sys.path under a name no other test uses (a module is imported once per process)."""
    name = f"user_algorithms_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_user_loss_computes_through_the_shared_objective(user_module):
    cfg = LossConfig(loss_type=f"{user_module}:PlainPolicyGradient")
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    old = logps.detach() - torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.0, 0.0]])
    advantages, mask = torch.tensor([1.0, -2.0]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = policy_loss(LossInputs(logps, advantages, mask, old_logps=old), cfg)
    ratio = torch.exp(logps - old)
    want = (-(ratio * advantages[:, None]) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert metrics["plain_ratio"] == pytest.approx(((ratio * mask).sum() / mask.sum()).item(), abs=1e-6)
    assert f"{user_module}:PlainPolicyGradient" not in LOSSES  # the registry lists the library's losses only


def test_a_user_estimator_is_the_run_s_estimator(user_module):
    cfg = load_config(overrides=["--advantage", f"{user_module}:Centred", "--loss-type",
                                 f"{user_module}:PlainPolicyGradient"])
    assert cfg.advantage == f"{user_module}:Centred" and cfg.loss.loss_type == f"{user_module}:PlainPolicyGradient"
    rewards = torch.tensor([1.0, 3.0, 0.0, float("nan")])
    advantages, metrics = ADVANTAGES[cfg.advantage]().estimate(reward_scores({"r": rewards}, [1.0], 2), None, cfg)
    assert advantages.tolist() == [-1.0, 1.0, 0.0, 0.0] and metrics["reward_mean"] == pytest.approx(4 / 3)


@pytest.mark.parametrize("value, says", [
    ("{m}:NotALoss", "is not a subclass of vlm_grpo.grpo.algorithm.losses.base.PolicyLoss"),
    ("{m}:Centred", "is not a subclass of vlm_grpo.grpo.algorithm.losses.base.PolicyLoss"),
    ("{m}:Missing", "has no class 'Missing'"),
    ("no_such_module_here:Loss", "cannot import no_such_module_here"),
    ("{m}:WithSettings", "declares settings (plain_scale)"),
    ("grpoo", "'grpoo' is not one of bnpo, "),
])
def test_a_loss_that_cannot_work_is_refused_naming_the_setting(user_module, value, says):
    value = value.format(m=user_module)
    with pytest.raises(SettingError) as err:
        load_config(overrides=["--loss-type", value])
    assert str(err.value).startswith("setting 'loss.loss_type': ") and says in str(err.value)


@pytest.mark.parametrize("value, says", [
    ("{m}:PlainPolicyGradient", "is not a subclass of vlm_grpo.grpo.algorithm.advantages.base.AdvantageEstimator"),
    ("no_such_module_here:Estimator", "cannot import no_such_module_here"),
    ("medain", "'medain' is not one of group, "),
])
def test_an_estimator_that_cannot_work_is_refused_naming_the_setting(user_module, value, says):
    with pytest.raises(SettingError) as err:
        load_config(overrides=["--advantage", value.format(m=user_module)])
    assert str(err.value).startswith("setting 'advantage': ") and says in str(err.value)


def test_a_run_trains_with_a_user_loss_and_estimator(user_module, tmp_path):
    from vlm_grpo.api.trainers import GRPOTrainer

    cfg = load_config(overrides=[
        "--output-dir", str(tmp_path / "run"), "--model", "tiny:qwen2_5_vl", "--data.recipe_options",
        "{image_size: 56}", "--max-new-tokens", "4", "--batch-size", "2", "--num-generations", "2",
        "--logging.progress", "false", "--log-completions", "false", "--max-steps", "1",
        "--data.rewards", "tests.grpo.toy_rewards:lowercase_share", "--learning-rate", "1e-2",
        "--loss-type", f"{user_module}:PlainPolicyGradient", "--advantage", f"{user_module}:Centred"])
    trainer = GRPOTrainer.from_settings(cfg)
    trainer.train()
    (row,) = trainer.history
    assert "plain_ratio" in row and torch.isfinite(torch.tensor(row["loss"]))
    assert f"loss_type: {user_module}:PlainPolicyGradient" in (tmp_path / "run" / "config.yaml").read_text()
