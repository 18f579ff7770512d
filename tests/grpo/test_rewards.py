"""Reward scoring: named weighted components, user functions by path, and failing rewards."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.grpo.rewards.weighted import RewardError, load_reward_function, parse_reward_specs, score
from vlm_grpo.recipes.base import Reward


def picky(completions, answer, **_):
    out = []
    for text, truth in zip(completions, answer):
        if text == "boom":
            raise KeyError("no parse")
        out.append(1.0 if text == truth else 0.0)
    return out


def test_weighted_components():
    rewards = [Reward("exact", picky, 2.0), Reward("length", lambda completions, **_: [len(c) for c in completions], 0.5)]
    total, parts = score(rewards, ["a", "bb"], {"answer": ["a", "x"]})
    assert parts["exact"].tolist() == [1.0, 0.0] and parts["length"].tolist() == [1.0, 2.0]
    assert total.tolist() == [2.5, 1.0]


def test_failing_reward_names_itself_and_the_sample():
    rewards = [Reward("picky", picky)]
    with pytest.raises(RewardError, match=r"reward 'picky' \(.*test_rewards.py:\d+\) raised KeyError: 'no parse' on completion 1 \('boom'\)"):
        score(rewards, ["a", "boom", "c"], {"answer": ["a", "b", "c"]})


def test_failing_reward_scored_zero_and_counted():
    errors: dict[str, int] = {}
    total, parts = score([Reward("picky", picky)], ["a", "boom", "c"], {"answer": ["a", "b", "c"]}, on_error="zero", errors=errors)
    assert parts["picky"].tolist() == [1.0, 0.0, 1.0]
    assert errors == {"picky": 1}
    assert torch.equal(total, parts["picky"])


def test_wrong_length_is_an_error():
    with pytest.raises(RewardError, match="returned 1 scores for 2"):
        score([Reward("short", lambda completions, **_: [0.0])], ["a", "b"], {})


def test_user_reward_from_a_named_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def brevity(completions, **_):\n    return [1.0 / (1 + len(c)) for c in completions]\n")
    fn = load_reward_function(f"{path}:brevity")
    assert fn(completions=["", "abc"]) == [1.0, 0.25]
    (spec,) = parse_reward_specs([f"short={path}:brevity*0.5"])
    assert spec.name == "short" and spec.weight == 0.5
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_reward_function(f"{path}:nope")
    with pytest.raises(ValueError, match="no such file"):
        load_reward_function(f"{tmp_path}/missing.py:f")
