"""Reward functions written for TRL run unchanged: TRL 1.16's keyword arguments, None as "not applicable"."""

from __future__ import annotations

import math
import re

import pytest
import torch
from PIL import Image
from trl.rewards import accuracy_reward, get_cosine_scaled_reward, think_format_reward

from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
from vlm_grpo.grpo.rewards.weighted import RewardError, nan_mean, run_rewards, score
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn


def boxed_answer(completions, ground_truth, **kwargs):
    """The TRL documentation's style: conversational completions, the answer in \\boxed{}, compared as text."""
    replies = [completion[0]["content"] for completion in completions]
    found = [re.search(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", reply) for reply in replies]  # one level of {} inside
    return [1.0 if m is not None and m.group(1).strip() == truth else 0.0 for m, truth in zip(found, ground_truth)]


REPLIES = [
    "<think>\nhalf of one\n</think>\nSo \\boxed{\\frac{1}{2}}",
    "I guess \\boxed{3}",
    "<think>x</think> \\boxed{7}",
]


def chat_inputs(solutions, ground_truth=("\\frac{1}{2}", "4", "7"), lengths=(5, 5, 5)) -> RewardInputs:
    prompt = [{"role": "user", "content": [{"type": "image", "image": None}, {"type": "text", "text": "Solve."}]}]
    return RewardInputs(
        list(REPLIES), {"solution": list(solutions), "ground_truth": list(ground_truth)}, prompts=[prompt] * 3,
        completion_ids=[[1] * n for n in lengths], conversational=[True] * 3, state=trainer_state(global_step=7),
    )


def test_trl_reward_functions_give_their_documented_values():
    inputs = chat_inputs(["\\frac{1}{2}", "$4$", "not maths at all"])
    rewards = [
        Reward("think", think_format_reward),
        Reward("accuracy", accuracy_reward, 2.0),
        Reward("cosine", get_cosine_scaled_reward(max_len=10)),
        Reward("boxed", boxed_answer, 0.5),
    ]
    total, parts = score(rewards, inputs)
    assert parts["think"].tolist() == [1.0, 0.0, 1.0]
    assert parts["accuracy"][:2].tolist() == [1.0, 0.0] and math.isnan(parts["accuracy"][2])  # unparseable gold: None
    # half of max_len on the cosine schedule: +0.75 right, -0.75 wrong (its docstring's numbers); None follows accuracy
    assert parts["cosine"][:2].tolist() == pytest.approx([0.75, -0.75]) and math.isnan(parts["cosine"][2])
    assert parts["boxed"].tolist() == [1.0, 0.0, 1.0]
    # NaN components are left out of the weighted sum (TRL's nansum): 1 + 2 + 0.75 + 0.5, 0 + 0 - 0.75 + 0, 1 + 0.5
    assert total.tolist() == pytest.approx([4.25, -0.75, 1.5])
    assert nan_mean(parts["accuracy"]) == 0.5  # logged means are over the completions a reward applies to
    # accuracy_reward logs its parse through log_extra, one value per completion
    assert inputs.extra_columns["gold_parsed"][2] == "[unparseable]" and len(inputs.extra_columns["solution"]) == 3


def test_a_completion_no_reward_applies_to_has_a_nan_total():
    total, parts = score([Reward("accuracy", accuracy_reward)], chat_inputs(["1", "2", "no maths"]))
    assert math.isnan(total[2]) and not torch.isnan(total[:2]).any()


def test_completions_follow_the_data_text_for_string_prompts_messages_for_chat_prompts():
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, step=trainer_state.global_step,
                    columns=columns)
        log_metric("spy_calls", 1.0)
        return [0.0] * len(completions)

    img = Image.new("RGB", (8, 8), "red")
    chat = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    samples = [
        Sample(prompt=chat, images=[img], fields={"solution": "red"}, data_prompt=list(chat)),
        Sample(prompt=user_turn("Colour?"), images=[img], fields={"solution": "blue"}, data_prompt="Colour?"),
    ]
    ids = torch.tensor([[5, 6, 2, 9], [7, 2, 9, 9], [3, 4, 8, 1], [2, 9, 9, 9]])  # EOS id 2: kept, then masked
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    inputs = RewardInputs.from_samples(samples, 2, ["a", "b", "c", "d"], ids, mask, trainer_state(global_step=3))
    score([Reward("spy", spy)], inputs)
    assert seen["completions"][:2] == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]
    assert seen["completions"][2:] == ["c", "d"]
    assert seen["prompts"][2] == "Colour?"  # a string prompt reaches rewards as the dataset wrote it
    assert seen["prompts"][0][1]["content"][0] == {"type": "image", "image": img}  # TRL fills the images in
    assert "image" not in samples[0].prompt[1]["content"][0]  # ...in a copy: the model's prompt is untouched
    assert seen["ids"] == [[5, 6, 2], [7, 2], [3, 4, 8, 1], [2]]
    assert seen["step"] == 3 and seen["columns"] == {"solution": ["red", "red", "blue", "blue"]}
    assert inputs.logged_metrics == {"spy_calls": [1.0]}


def test_a_reward_without_kwargs_gets_only_what_it_names():
    def narrow(completions, solution):
        return [float(c == s) for c, s in zip(completions, solution)]

    total, _ = score([Reward("narrow", narrow)], ["x", "y"], {"solution": ["x", "z"], "other": [1, 2]})
    assert total.tolist() == [1.0, 0.0]


def test_a_message_reward_on_text_completions_says_what_it_got():
    inputs = RewardInputs(["<think>a</think>b"], {}, prompts=["Say it."], conversational=[False])
    with pytest.raises(RewardError, match=r"reward 'think' \(think_format_reward at .*format_rewards.py:\d+\) raised TypeError.* on completion 0 .*plain text because"):
        score([Reward("think", think_format_reward)], inputs)
    errors: dict[str, int] = {}
    total, _ = score([Reward("think", think_format_reward)], inputs, on_error="zero", errors=errors)
    assert total.tolist() == [0.0] and errors == {"think": 1}


def test_reward_weights_replace_each_rewards_own_and_must_match_in_number():
    recipe = Recipe("toy", build=lambda **_: [], rewards=[Reward("a", boxed_answer, 3.0), Reward("b", think_format_reward)])
    assert [r.weight for r in run_rewards(recipe, [], [0.5, 2.0])] == [0.5, 2.0]
    assert [r.weight for r in recipe.rewards] == [3.0, 1.0]  # the recipe's own list is not changed
    with pytest.raises(ValueError, match="2 weights for 1 rewards"):
        run_rewards(recipe, ["trl.rewards:think_format_reward"], [1.0, 2.0])
    with pytest.raises(ValueError, match="carries a weight and data.reward_weights is set too"):
        run_rewards(recipe, ["trl.rewards:think_format_reward*2"], [1.0])
    with pytest.raises(ValueError, match="two rewards are named 'think_format_reward'"):
        run_rewards(recipe, ["trl.rewards:think_format_reward", "trl.rewards:think_format_reward"])
    with pytest.raises(ValueError, match="has no rewards of its own"):
        run_rewards(Recipe("bare", build=lambda **_: [], rewards=[]), [])


def test_reward_appends_and_reward_weights_are_a_list(tmp_path):
    cfg = load_config(overrides=["--reward", "trl.rewards:think_format_reward", "--reward", "my_rewards.py:accuracy",
                                 "--reward-weights", "1,0.5"])
    assert cfg.data.rewards == ["trl.rewards:think_format_reward", "my_rewards.py:accuracy"]
    assert cfg.data.reward_weights == [1.0, 0.5]
    path = tmp_path / "run.yaml"
    path.write_text("reward: a.py:f\ndata:\n  reward_weights: [2]\n")
    cfg = load_config(path, overrides=["--reward", "b.py:g"])  # the command line adds to the file's
    assert cfg.data.rewards == ["a.py:f", "b.py:g"] and cfg.data.reward_weights == [2.0]
    assert load_config(overrides=["--reward", "a.py:f", "--data.rewards", "c.py:h"]).data.rewards == ["c.py:h"]
