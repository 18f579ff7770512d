"""The contract every user call runs under (grpo/call_contract.py), at unit level: a fork inside it never runs the
trainer's code; process-wide state it changes is put back with one warning naming it, or the call fails, named;
numbers no float holds are one named error; a signal that lands after a step's save still stops before the next."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerState  # noqa: F401 - imported up front: a test's time is its own, not the import's

from tests.reliability import faulty_user_code as corpus
from vlm_grpo.grpo import call_contract
from vlm_grpo.grpo.interrupts import StopSignal
from vlm_grpo.grpo.parts.saves import Saves
from vlm_grpo.grpo.rewards.inputs import RewardInputs
from vlm_grpo.grpo.rewards.weighted import RewardError, score, weighed
from vlm_grpo.grpo.run.stop_signals import stop_on_signals
from vlm_grpo.grpo.user_calls import UserCodeError, call
from vlm_grpo.recipes.base import Reward

TEXTS = ["alpha", "beta"]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(call_contract, "_warned", set())  # each test sees its own first warning


def scored(fn, texts=TEXTS, rows=None, on_error="raise"):
    inputs = RewardInputs(list(texts), {}, rows=rows)
    return score([Reward(fn.__name__, fn)], inputs, on_error=on_error)[1][fn.__name__].tolist()


def contract_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == call_contract.__name__]


# ---------------------------------------------------------------- a fork without exec
def test_a_forking_reward_gives_the_parents_scores_once_and_its_child_never_comes_back(tmp_path):
    parent, came_back = os.getpid(), tmp_path / "child-came-back"
    try:
        scores = scored(corpus.reward_forks)
    finally:
        if os.getpid() != parent:  # the child, back in the caller's code: what the contract must make impossible
            came_back.write_text(str(os.getpid()))
            os._exit(0)
    _, status = os.waitpid(corpus.FORKED.pop(), 0)
    assert scores == [0.5, 0.5]
    assert not came_back.exists()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# ---------------------------------------------------------------- process-wide state: put back, warned once
def _grad(): return torch.is_grad_enabled()
def _dtype(): return torch.get_default_dtype()
def _threads(): return torch.get_num_threads()
def _cwd(): return os.getcwd()
def _stdout(): return sys.stdout


@pytest.mark.parametrize("fn, what, read", [
    (corpus.reward_chdir, "working directory", _cwd),
    (corpus.reward_async_chdir, "working directory", _cwd),
    (corpus.reward_replaces_stdout, "sys.stdout", _stdout),
    (corpus.reward_grad_off, "grad mode", _grad),
    (corpus.reward_float64, "default dtype", _dtype),
    (corpus.reward_threads, "number of threads", _threads),
    (corpus.reward_meta_device, "default device", lambda: torch.get_default_device()),
], ids=["chdir", "async-chdir", "stdout", "grad-mode", "dtype", "threads", "device"])
def test_state_a_reward_changes_is_put_back_with_one_warning_naming_it(fn, what, read, caplog):
    before = read()
    assert scored(fn) == [0.0, 0.0]
    assert read() == before
    assert scored(fn) == [0.0, 0.0] and read() == before
    said = contract_warnings(caplog)
    assert len(said) == 1, said
    assert re.match(rf"reward '{fn.__name__}' \(.*faulty_user_code\.py:\d+\) changed the {what} \(", said[0]), said[0]
    assert "\n" not in said[0]


@pytest.mark.parametrize("fn, sig", [(corpus.reward_ignores_sigterm, signal.SIGTERM),
                                     (corpus.reward_own_sigint_handler, signal.SIGINT)], ids=["sigterm", "sigint"])
def test_a_reward_that_sets_a_signal_handler_leaves_the_trainers_stop_in_place(fn, sig, caplog):
    with stop_on_signals() as stop:
        scored(fn)
        os.kill(os.getpid(), sig)  # after the call: the trainer's handler must be the one to get it
    assert stop.signum == sig
    said = contract_warnings(caplog)
    assert len(said) == 1 and f"reward '{fn.__name__}' (" in said[0]
    assert f"changed the {signal.Signals(sig).name} handler" in said[0]


def test_a_tool_or_environment_call_is_held_to_the_same_contract(caplog):
    before = os.getcwd()
    call("environment reset", corpus.reward_chdir, [])
    assert os.getcwd() == before
    assert contract_warnings(caplog)[0].startswith("environment reset 'reward_chdir' (")


@pytest.mark.parametrize("on_error", ["raise", "zero"])  # zero too: a broken process is not a score of 0
def test_a_reward_that_closes_stdout_fails_naming_it(monkeypatch, on_error):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(RewardError) as err:
        scored(corpus.reward_closes_stdout, on_error=on_error)
    text = str(err.value)
    assert re.match(r"reward 'reward_closes_stdout' \(.*faulty_user_code\.py:\d+\) closed sys\.stdout ", text), text
    assert "\n" not in text and "leave it open" in text


def test_a_reward_that_closes_stdouts_file_descriptor_fails_naming_it(monkeypatch):
    monkeypatch.setattr(sys, "stdout", open(os.dup(1), "w", closefd=False))  # a descriptor of its own to close
    with pytest.raises(RewardError, match=r"reward 'reward_closes_stdout_fd' \(.*faulty_user_code\.py:\d+\) closed file "
                                          r"descriptor \d+ \(sys\.stdout; "):
        scored(corpus.reward_closes_stdout_fd)


def test_a_changed_state_does_not_hide_the_calls_own_error(caplog):
    def chdir_then_raise():
        os.chdir("/")
        raise KeyError("the real problem")

    before = os.getcwd()
    with pytest.raises(UserCodeError, match="raised KeyError: 'the real problem'"):
        call("tool", chdir_then_raise)
    assert os.getcwd() == before
    assert "changed the working directory" in contract_warnings(caplog)[0]


# ---------------------------------------------------------------- numbers no float holds
@pytest.mark.parametrize("value, shown", [
    (10**400, "an integer of about 401 digits"),
    (-10**5000, "-an integer of about 5001 digits"),  # past 4300 digits Python will not even print it
    (Fraction(10**400, 3), "Fraction("),
], ids=["huge-int", "huger-negative-int", "huge-fraction"])
def test_a_score_no_float_holds_is_one_line_naming_reward_row_and_value(value, shown):
    def huge(completions, **_):
        return [0.0, value]

    with pytest.raises(RewardError) as err:
        scored(huge, rows=[3, 7])
    text = str(err.value)
    assert text.startswith(f"reward 'huge' returned a bad score for completion 1 ('beta'), dataset row 7: the score "
                           f"{shown}"), text
    assert "a score must lie within +-1e+06" in text and "\n" not in text and len(text) < 300


def test_a_huge_integer_score_counts_as_an_error_in_zero_mode():
    errors: dict[str, int] = {}
    _, parts = score([Reward("huge", corpus.reward_huge_int)], list(TEXTS), on_error="zero", errors=errors)
    assert parts["huge"].tolist() == [0.0, 0.0] and errors == {"huge": 1}


def test_a_weight_no_float_holds_is_named():
    with pytest.raises(ValueError, match=r"reward 'w': weight an integer of about 401 digits is out of range"):
        weighed([Reward("w", corpus.reward_chdir, weight=10**400)])


# ---------------------------------------------------------------- a signal after a step's save: no further step
def _saves(save_every: int, saved: list, on_save=lambda: None) -> Saves:
    ctx = SimpleNamespace(cfg=SimpleNamespace(max_steps=5), agreed_stop=lambda signum: signum or 0, run_dir="run",
                          resume_hint="--resume")
    return Saves(ctx, SimpleNamespace(save=lambda step: (saved.append(step), on_save())), save_every)


def test_a_sigterm_during_a_periodic_save_stops_after_that_step():
    saved: list[int] = []
    saves = _saves(1, saved, on_save=lambda: os.kill(os.getpid(), signal.SIGTERM))
    with stop_on_signals() as stop, pytest.raises(StopSignal, match="^stopped at step 1 by SIGTERM; checkpoint-1 saved"):
        saves.after_step(1, stop, None, close=lambda: None)
    assert saved == [1]


@pytest.mark.parametrize("save_every, saved_now", [(0, [2]), (2, [])], ids=["unsaved", "saved-periodically"])
def test_a_sigterm_after_a_steps_save_stops_before_the_next_step(save_every, saved_now):
    saved: list[int] = []
    saves = _saves(save_every, saved)
    with stop_on_signals() as stop:
        saves.before_step(2, stop, close=lambda: None)  # no signal yet: the next step runs
        os.kill(os.getpid(), signal.SIGTERM)  # in a step hook or callback, after step 2's save
        with pytest.raises(StopSignal, match="^stopped at step 2 by SIGTERM; checkpoint-2 saved"):
            saves.before_step(2, stop, close=lambda: None)
    assert saved == saved_now
