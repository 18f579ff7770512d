"""Reward models: a sequence-classification model scores prompt + completion as TRL's GRPOTrainer does (its own
text building as the oracle), a VLM judge scores its answer's first token as `generate` sees it, and both train
2 steps from the command line (`--reward-model`) on tiny models built offline."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tests.recipes.helpers import image, save_image, write_jsonl
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer
from vlm_grpo.cli import main
from vlm_grpo.grpo.rewards.inputs import filled_messages
from vlm_grpo.grpo.rewards.judge import VLMJudge
from vlm_grpo.grpo.rewards.reward_model import RewardModel
from vlm_grpo.grpo.rewards.weighted import reward_model_kind
from vlm_grpo.grpo.run.logs import read_jsonl

RUN = ["--model", "tiny:smolvlm", "--max-new-tokens", "4", "--logging.progress", "false", "--max-steps", "2",
       "--batch-size", "2", "--num-generations", "2", "--save-every", "0"]


def tiny_reward_model(folder):
    """A 2-layer Qwen2 sequence classifier (one label) with the tiny twins' tokenizer and a ChatML template, saved."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = build_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template=chatml_template(""),
                                eos_token="<|im_end|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@functools.lru_cache(maxsize=1)
def judge_policy():
    from vlm_grpo.adapters.registry import family_class

    return family_class("smolvlm").tiny(seed=1)


def test_a_classifier_scores_what_trl_scores(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl.data_utils import apply_chat_template

    folder = tiny_reward_model(tmp_path / "rm")
    reward = RewardModel(str(folder), batch_size=3)
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many circles?"}]}]
    prompts = [filled_messages(chat, [image(0)]), filled_messages(chat, [image(1)]), "Count the dogs. ", "Red? "]
    completions = [[{"role": "assistant", "content": "There are 3 circles."}],
                   [{"role": "assistant", "content": "I see 7."}], "The answer is 2.", "Yes, it is red and green."]
    scores = reward(prompts=prompts, completions=completions)
    # the oracle: TRL's own text for each completion, read alone (no padding) by the same model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    text_chat = [{"role": "user", "content": "How many circles?"}]
    texts = [apply_chat_template({"messages": text_chat + completions[0]}, tokenizer)["text"],
             apply_chat_template({"messages": text_chat + completions[1]}, tokenizer)["text"],
             prompts[2] + completions[2], prompts[3] + completions[3]]
    with torch.no_grad():
        expected = [model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item() for t in texts]
    assert len(set(round(e, 4) for e in expected)) == 4  # four different texts, four different scores
    assert scores == pytest.approx(expected, abs=1e-5)
    assert reward.__name__ == "reward_model" and reward_model_kind(str(folder)) == ("classifier", str(folder))


def test_a_vlm_judge_scores_its_first_answer_token(tmp_path):
    adapter = judge_policy()
    judge = VLMJudge(adapter, "Is the count right? Answer yes or no.", batch_size=2)
    prompts = ["How many squares?", "How many circles?", "Which colour?"]
    completions = ["3 squares.", "I see 5 circles.", "green"]
    pictures = [[image(0)], [image(1)], [image(2), image(3)]]
    scores = judge(prompts=prompts, completions=completions, images=pictures)
    assert all(0.0 < s < 1.0 for s in scores)
    for i in range(3):  # the oracle: the judge's own first generated token, one completion at a time
        conv = judge.conversation(prompts[i], completions[i], len(pictures[i]))
        batch = adapter.encode_prompts([conv], [pictures[i]])
        out = adapter.generate(batch, max_new_tokens=1, output_logits=True, use_cache=False)
        probs = out.logits[0][0].float().softmax(-1)
        yes, no = probs[judge.yes_ids].sum().item(), probs[judge.no_ids].sum().item()
        assert scores[i] == pytest.approx(yes / (yes + no), abs=1e-5)
    other = judge(prompts=prompts[:1], completions=completions[:1], images=[[image(4)]])
    assert other[0] != scores[0]  # the judge sees the image
    assert reward_model_kind("judge:tiny:smolvlm") == ("judge", "tiny:smolvlm")
    assert reward_model_kind("tiny:smolvlm") == ("judge", "tiny:smolvlm")


def _colour_rows(tmp_path):
    for i in range(4):
        save_image(tmp_path / f"{i}.png", i)
    return write_jsonl(tmp_path / "rows.jsonl", [{"prompt": f"Which colour is picture {i}? ", "image": f"{i}.png"}
                                                 for i in range(4)])


def test_a_reward_model_run_trains_two_steps(tmp_path):
    folder = tiny_reward_model(tmp_path / "rm")
    out = tmp_path / "run"
    assert main(["train", *RUN, "--dataset", str(_colour_rows(tmp_path)), "--reward-model", f"rm={folder}*0.5",
                 "--output-dir", str(out)]) == 0
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(math.isfinite(m["rewards/rm"]) for m in metrics)
    rows = read_jsonl(out / "completions.jsonl")
    reward = RewardModel(str(folder))
    for row in rows[:2]:  # the logged score is the model's score of that prompt + completion
        prompt = f"Which colour is picture {row['sample_index']}? "
        assert row["rewards"]["rm"] == pytest.approx(reward([prompt], [row["completion"]])[0], abs=1e-5)
        assert row["reward"] == pytest.approx(0.5 * row["rewards"]["rm"], abs=1e-5)


def test_a_vlm_judge_run_trains_two_steps(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *RUN, "--recipe", "shapes", "--data.recipe_options", "{image_size: 56}", "--reward-model",
                 "judge:tiny:smolvlm", "--judge-question", "Is this count right?", "--output-dir", str(out)]) == 0
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(0.0 < m["rewards/judge"] < 1.0 for m in metrics)
    assert {"correctness", "description", "reasoning", "judge"} == set(read_jsonl(out / "completions.jsonl")[0]["rewards"])


def test_a_model_that_is_neither_is_refused_by_name(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, architectures=["Qwen2ForCausalLM"]
                ).save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match=r"reward model '.*lm': \['Qwen2ForCausalLM'\] is neither a sequence-classification"):
        reward_model_kind(str(tmp_path / "lm"))
    with pytest.raises(ValueError, match="reward model '/no/such/model': cannot read its config"):
        reward_model_kind("/no/such/model")
