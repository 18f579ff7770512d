"""The loss section is one plain dataclass written out in losses/config.py; a loss names the options it reads in its
class's `settings` (fields of that dataclass), says in `sums_sequence_ratio` whether the settings warn at the
sequence level, and the run's objective builds the loss object once, not per micro-batch."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import textwrap

import pytest
import torch

from vlm_grpo.grpo.algorithm.losses import LOSSES, LossConfig, LossInputs, PolicyObjective
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config

USER_CODE = '''
from vlm_grpo.grpo.algorithm.losses.base import PolicyLoss


class Counted(PolicyLoss):
    """-ratio x advantage over the tokens; counts how often it is built."""
    name, summary, paper, normalisation = "counted", "-ratio x A", "none", "tokens"
    built = 0

    def __init__(self):
        type(self).built += 1

    def per_token(self, terms, cfg):
        return -terms.ratio * terms.advantages, {}


class Summing(Counted):
    sums_sequence_ratio = True


class ReadsGmpoClip(Counted):
    settings = ("gmpo_clip",)


class ReadsUnknown(Counted):
    settings = ("no_such_option",)


class SettingsAsText(Counted):
    settings = "gmpo_clip"


class SettingsAsNumber(Counted):
    settings = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_losses_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_every_field_is_written_out_in_the_class_body():
    body = inspect.getsource(LossConfig)
    missing = [f.name for f in dataclasses.fields(LossConfig) if f"\n    {f.name}: " not in body]
    assert missing == []


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_loss_s_own_settings_are_fields_its_help_names(name):
    fields = {f.name: f for f in dataclasses.fields(LossConfig)}
    for key in LOSSES[name].settings:
        assert key in fields, (name, key)
        assert fields[key].metadata["help"].startswith(f"{name}: "), (name, key)


def test_the_losses_that_sum_a_sequence_s_tokens_say_so():
    assert {n for n, cls in LOSSES.items() if cls.sums_sequence_ratio} == {"bnpo", "cispo", "dapo", "dr_grpo"}


def test_the_sequence_level_warning_follows_the_class_attribute(user_module, caplog):
    with caplog.at_level(logging.WARNING, logger="vlm_grpo.grpo.algorithm.losses.config"):
        LossConfig(loss_type=f"{user_module}:Counted", importance_sampling_level="sequence")
        assert "sums per-token contributions" not in caplog.text
        LossConfig(loss_type=f"{user_module}:Summing", importance_sampling_level="sequence")
        assert f"the '{user_module}:Summing' loss sums per-token contributions" in caplog.text


def test_a_loss_may_read_a_field_of_the_loss_section(user_module):
    cfg = load_config(overrides=["--loss-type", f"{user_module}:ReadsGmpoClip", "--loss.gmpo_clip", "0.3"])
    assert cfg.loss.gmpo_clip == 0.3


@pytest.mark.parametrize("cls, says", [
    ("ReadsUnknown", "it declares settings (no_such_option), which are not fields of the loss section"),
    ("SettingsAsText", "settings 'gmpo_clip' is not a tuple of the loss section's field names"),
    ("SettingsAsNumber", "settings 3 is not a tuple of the loss section's field names"),
])
def test_a_loss_naming_no_field_is_refused(user_module, cls, says):
    with pytest.raises(SettingError) as err:
        load_config(overrides=["--loss-type", f"{user_module}:{cls}"])
    assert str(err.value).startswith("setting 'loss.loss_type': ") and says in str(err.value)


def test_the_objective_builds_its_loss_once(user_module):
    objective = PolicyObjective(LossConfig(loss_type=f"{user_module}:Counted"))
    counted = type(objective.loss)
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.3]], requires_grad=True)
    inputs = LossInputs(logps, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    first, _ = objective(inputs)
    second, _ = objective(inputs)
    assert counted.built == 1 and first.item() == second.item() == 0.0
