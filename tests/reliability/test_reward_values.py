"""What rewards return is checked and named precisely (wrong types, strings, inf/NaN/out-of-range scores, exits);
async rewards run as in TRL 1.16 (awaited together); steps without learning signal warn with their cause."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import sys

import numpy as np
import pytest
import torch

from tests.reliability.conftest import RUN, same_weights
from vlm_grpo.cli import main
from vlm_grpo.grpo.rewards.weighted import RewardError, score
from vlm_grpo.grpo.guards.watchdogs import LearningSignalMonitor
from vlm_grpo.recipes.base import Reward

TEXTS = ["alpha", "beta", "gamma", "delta"]


def returning(value, name: str = "odd"):
    def reward(completions, **_):
        return value
    return Reward(name, reward)


@pytest.mark.parametrize("value, message", [
    (None, "reward 'odd' returned None instead of a list of 4 scores, one per completion (None inside the list marks "
           "a completion it does not apply to)"),
    (1.0, "reward 'odd' returned a float ('1.0') instead of a list of 4 scores, one per completion (None inside the "
          "list marks a completion it does not apply to)"),
    ("good", "reward 'odd' returned a str ('good') instead of a list of 4 scores"),
    (np.ones((4, 1)), "reward 'odd' returned a 2-D ndarray of shape (4, 1); expected 4 scores in one dimension, one "
                      "per completion"),
    ([1.0, 2.0, 3.0], "reward 'odd' returned 3 scores for 4 completions"),
    (["1.0", "0", "1", "0"], "reward 'odd' returned a bad score for completion 0 ('alpha'): the score is the string "
                             "'1.0', not a number: return the number, float('1.0')"),
    ([1.0, "good", 0.0, 0.0], "reward 'odd' returned a bad score for completion 1 ('beta'): the score is the string "
                              "'good', not a number"),
    ([1.0, 0.0, math.inf, 0.0], "reward 'odd' returned a bad score for completion 2 ('gamma'): the score is inf: "
                                "scores must be finite"),
    ([math.nan, 0.0, 0.0, 0.0], "reward 'odd' returned a bad score for completion 0 ('alpha'): the score is NaN: "
                                "return None for a completion a reward does not apply to"),
    ([0.0, 0.0, 0.0, 1e300], "reward 'odd' returned a bad score for completion 3 ('delta'): the score 1e+300 is out "
                             "of range: a score must lie within +-1e+06"),
    ([[1.0], [0.0], [0.0], [0.0]], "reward 'odd' returned a bad score for completion 0 ('alpha'): the score is a list "
                                   "([1.0]), not a number"),
], ids=["None", "scalar", "string", "2-D", "too-few", "numeric-string", "word", "inf", "nan", "huge", "nested"])
def test_a_bad_return_value_is_named_precisely(value, message):
    with pytest.raises(RewardError) as err:
        score([returning(value)], TEXTS)
    assert str(err.value).startswith(message) and "raised" not in str(err.value)


@pytest.mark.parametrize("value", [
    [1, 0.5, True, 0], np.array([1.0, 0.5, 1.0, 0.0]), torch.tensor([1.0, 0.5, 1.0, 0.0]),
    [np.float32(1.0), np.float64(0.5), torch.tensor(1.0), np.int64(0)],
], ids=["python", "numpy", "torch", "scalars"])
def test_every_number_form_trl_accepts_is_a_score(value):
    total, parts = score([returning(value), returning([None, None, None, 2.0], "sparse")], TEXTS)
    assert parts["odd"].tolist() == [1.0, 0.5, 1.0, 0.0] and total.tolist() == [1.0, 0.5, 1.0, 2.0]


def test_bad_scores_count_as_errors_in_zero_mode():
    errors: dict[str, int] = {}
    total, parts = score([returning([1.0, math.inf, "x", 0.5])], TEXTS, on_error="zero", errors=errors)
    assert parts["odd"].tolist() == [1.0, 0.0, 0.0, 0.5] and errors == {"odd": 2}


@pytest.mark.parametrize("leave, says", [
    (lambda: sys.exit(3), "called sys.exit(3)"),
    (lambda: sys.exit("bye"), "called sys.exit('bye')"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "raised KeyboardInterrupt"),
])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_user_code_that_exits_is_a_reward_error_naming_the_completion(leave, says, kind):
    def quit_on_gamma(completions, **_):
        if "gamma" in completions:
            leave()
        return [0.0] * len(completions)

    async def quit_on_gamma_async(completions, **kwargs):
        return quit_on_gamma(completions, **kwargs)

    fn = quit_on_gamma if kind == "sync" else quit_on_gamma_async
    with pytest.raises(RewardError, match=rf"^reward .q. \(quit_on_gamma(_async)? at .*test_reward_values.py:\d+\) "
                                          rf"{re.escape(says)} on completion 2 \('gamma'\): a reward must return its "
                                          "scores, not end the program$"):
        score([Reward("q", fn)], TEXTS)


def test_async_rewards_are_awaited_together_as_in_trl():
    """Each waits for the other's signal: run one after the other, the first would never finish."""
    events: dict[str, asyncio.Event] = {}

    def waiting_for(mine: str, theirs: str):
        async def reward(completions, **_):
            events.setdefault(mine, asyncio.Event()).set()
            await asyncio.wait_for(events.setdefault(theirs, asyncio.Event()).wait(), timeout=30)
            return [float(len(c)) for c in completions]
        return reward

    total, parts = score([Reward("a", waiting_for("a", "b")), Reward("b", waiting_for("b", "a"), 0.5)], TEXTS)
    assert parts["a"].tolist() == [5.0, 4.0, 5.0, 5.0] and total.tolist() == [7.5, 6.0, 7.5, 7.5]


def test_a_run_with_an_async_reward_equals_the_same_reward_sync(tmp_path, straight):
    words = [w if w != "tests.reliability.step_rewards:lowercase" else "tests.reliability.step_rewards:lowercase_async"
             for w in RUN]
    assert main(["train", *words, "--max-steps", "2", "--output-dir", str(tmp_path)]) == 0
    assert same_weights(tmp_path, straight(2))


def test_the_monitor_names_why_steps_carry_no_signal(caplog):
    flat = {"frac_reward_zero_std": 1.0, "reward": 0.0, "reward_std": 0.0, "rewards/accuracy": 0.0}
    with caplog.at_level(logging.WARNING):
        cold = LearningSignalMonitor(temperature=0.01)
        said = [[t.message for t in cold.observe(s, {**flat, "step": s}, {})] for s in (1, 2, 3, 4)]
        assert said[:2] == [[], []] and said[3] == []  # warned once, at the third step in a row
        assert said[2] == ["steps 1-3: in every group the completions had the same reward (frac_reward_zero_std = 1), "
                           "so these steps trained nothing: generation.temperature 0.01 is so low that the completions "
                           "of a prompt come out (nearly) the same: sample hotter (0.7-1.0)"]
        warm = LearningSignalMonitor(temperature=1.0)
        assert [warm.observe(s, {**flat, "step": s}, {}) for s in (1, 2, 3)][-1][0].message.endswith(
            "every completion of the step scored 0: the rewards never tell completions apart (a reward that never "
            "fires, or a task far too hard or too easy)")
        assert [t.message for t in warm.observe(9, {"frac_reward_zero_std": 0.0, "reward": math.nan,
                                                   "rewards/accuracy": math.nan}, {})] == ["step 9: reward 'accuracy' returned None for every completion (it applies to none of them); check the "
                "columns it reads", "step 9: no reward applies to any completion: every advantage is 0 and the step "
                "trains nothing"]
    assert "generation.temperature 0.01" in caplog.text


def test_a_near_zero_temperature_run_warns_with_the_cause(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert main(["train", *RUN, "--max-steps", "3", "--temperature", "1e-5", "--output-dir", str(tmp_path)]) == 0
    assert "steps 1-3: in every group the completions had the same reward" in caplog.text
    assert "generation.temperature 1e-05 is so low" in caplog.text
