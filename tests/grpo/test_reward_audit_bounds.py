"""The reward audit's cost is bounded whatever the rows hold, and each adversary is built to fit the completion
budget, so what it claims (a complete answer, every tag closed) still holds once the run cuts it."""

from __future__ import annotations

import re
import types

import pytest
from transformers import AutoTokenizer

from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer
from vlm_grpo.cli import main
from vlm_grpo.grpo.rewards.audit import answer_space, audit_rewards, build_adversaries, completion_tokens
from vlm_grpo.grpo.rewards.audit_bounds import MAX_AUDIT_ROWS, audit_rows, text_fits
from vlm_grpo.grpo.settings.model import ModelConfig
from vlm_grpo.grpo.settings.sections import GenerationConfig
from vlm_grpo.grpo.training.preflight import cheap_checks, check_drawn_sample
from vlm_grpo.pretrained import ROOT, run_defaults
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.audit_hints import DEFAULT_HINTS
from vlm_grpo.recipes.base import Reward, Sample

ANSWER_ADVERSARIES = ("enumerate", "repeat", "right_answer_bare", "wrong_answer", "reference")


@pytest.fixture(scope="module")
def tokenizers():
    """The CLI's default model's tokenizer, and a coarser byte-level vocabulary (more tokens per word)."""
    coarse = build_tokenizer(["<|endoftext|>"], chat_template="", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                             vocab_size=300)
    return {"default": AutoTokenizer.from_pretrained(ROOT / "shapes-tiny"), "coarse": coarse}


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def says(text: str, answer: str) -> bool:
    return re.search(rf"\b{re.escape(' '.join(words(answer)))}\b", " ".join(words(text))) is not None


def tags_closed(text: str) -> bool:
    return all(f"</{name}>" in text[m.end():] for m in re.finditer(r"<(\w+)>", text) for name in [m.group(1)])


@pytest.mark.parametrize("recipe_name", ["compare_counts", "shapes", "cryptogram"])
@pytest.mark.parametrize("vocabulary", ["default", "coarse"])
def test_every_adversary_keeps_its_payload_once_cut_to_the_budget(recipe_name, vocabulary, tokenizers):
    recipe, tokenizer = get_recipe(recipe_name), tokenizers[vocabulary]
    data = recipe.build(size=3, **({"image_size": 64} if recipe_name == "shapes" else {}))
    samples = [data[i] for i in range(3)]
    hints = recipe.audit or DEFAULT_HINTS
    space = answer_space(samples, hints)
    built_at = {}
    for budget in (16, 32, 64):
        encode = completion_tokens(tokenizer, tokenizer.eos_token_id, budget)
        fits, max_chars = text_fits(encode)
        for sample, candidates in zip(samples, space):
            answer = hints.answer(sample)
            texts, listed = build_adversaries(sample, hints, answer, candidates, words=2 * budget, fits=fits,
                                              max_chars=max_chars)
            for name, text in texts.items():
                if text is None:
                    continue
                cut, ids = encode(text)
                assert cut == text and ids[-1] == tokenizer.eos_token_id and len(ids) <= budget, (budget, name, text)
                assert tags_closed(cut), (budget, name, cut)
            if texts["reference"] is not None:
                assert says(hints.span(texts["reference"]), answer)
            if texts["enumerate"] is not None:
                stated = hints.span(texts["enumerate"])
                assert says(stated, answer) and listed >= 2
                assert sum(says(stated, c) for c in candidates) == listed  # each listed answer whole
            if texts["wrong_answer"] is not None:
                assert says(hints.span(texts["wrong_answer"]), hints.wrong(sample, answer, candidates))
            if texts["repeat"] is not None:
                times = len(texts["repeat"].split()) // len(answer.split())
                assert texts["repeat"] == " ".join([answer] * times) and times > 1  # each copy whole
            built_at[budget] = built_at.get(budget, 0) + sum(texts[n] is not None for n in ANSWER_ADVERSARIES)
    assert built_at[16] <= built_at[32] <= built_at[64]  # a larger budget holds at least as many adversaries
    if recipe_name != "cryptogram":  # its spelled-out answers take more than 64 tokens to enumerate on a coarse vocabulary
        assert built_at[64] == len(ANSWER_ADVERSARIES) * len(samples)


def test_a_reward_paying_the_answer_anywhere_is_flagged_at_the_cli_default_budget_on_compare_counts():
    model = ModelConfig().name  # the CLI's defaults: its model and completion budget
    limit = run_defaults(model).get("generation", {}).get("max_new_tokens", GenerationConfig().max_new_tokens)
    assert model == "pretrained:shapes-tiny" and limit == 24
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "shapes-tiny")
    recipe = get_recipe("compare_counts")
    data = recipe.build(size=8, seed=0)

    def anywhere(completions, answer, **_):
        return [1.0 if truth in text.lower() else 0.0 for text, truth in zip(completions, answer)]

    report = audit_rewards([Reward("anywhere", anywhere)], [data[i] for i in range(8)], recipe.audit,
                           encode=completion_tokens(tokenizer, tokenizer.eos_token_id, limit), padding_words=2 * limit)
    assert ("anywhere", "enumerate") in {(f.component, f.adversary) for f in report.flags()}, report.table()
    assert report.examples["enumerate"].endswith("</answer>") and all(k == 2 for k in report.candidates)


class CountingTokenizer:
    """The default tokenizer, recording the length of every text it is given."""

    def __init__(self, inner):
        self.inner, self.lengths = inner, []

    def __call__(self, text, **options):
        self.lengths.append(len(text))
        return self.inner(text, **options)

    def decode(self, ids):
        return self.inner.decode(ids)

    def get_vocab(self):
        return self.inner.get_vocab()


def test_rows_of_5_mb_answers_are_read_only_as_far_as_the_budget_reaches(tokenizers):
    big = [Sample([{"role": "user", "content": "How many?"}], [], fields={"solution": f"word{k} " * 1_000_000},
                  reference="<answer>" + "x " * 2_500_000 + "</answer>") for k in range(4)]
    tokenizer = CountingTokenizer(tokenizers["default"])
    encode = completion_tokens(tokenizer, tokenizers["default"].eos_token_id, 24)
    seen = []

    def reward(completions, solution, **_):
        seen.extend(len(c) for c in completions)
        return [0.0] * len(completions)

    report = audit_rewards([Reward("r", reward)], big, DEFAULT_HINTS, encode=encode, padding_words=48)
    assert report.samples == 4 and max(tokenizer.lengths) <= encode.max_chars
    assert sum(tokenizer.lengths) <= 4 * 50 * encode.max_chars  # a few dozen short texts a row
    assert max(seen) <= encode.max_chars
    assert all(report.per_row[(name, "r")] == [float("nan")] * 4 or all(v != v for v in report.per_row[(name, "r")])
               for name in ANSWER_ADVERSARIES)  # no answer that long fits 24 tokens: none was scored
    assert any("24-token completion budget" in note for note in report.notes)


def test_the_audit_scores_a_bounded_number_of_rows_drawn_by_the_seed():
    rows = []

    def reward(completions, **_):
        rows.append(len(completions))
        return [0.0] * len(completions)

    samples = [Sample([{"role": "user", "content": "How many?"}], [], fields={"answer": str(k % 5)})
               for k in range(MAX_AUDIT_ROWS + 36)]
    report = audit_rewards([Reward("r", reward)], samples)
    assert report.samples == MAX_AUDIT_ROWS and max(rows) == MAX_AUDIT_ROWS
    assert any(f"at most {MAX_AUDIT_ROWS}" in note for note in report.notes)
    picked = audit_rows(10**6, seed=3)
    assert picked == audit_rows(10**6, seed=3) != audit_rows(10**6, seed=4) and len(picked) == 8
    assert audit_rows(5, seed=3) == [0, 1, 2, 3, 4]
    assert main(["audit-rewards", "--samples", str(MAX_AUDIT_ROWS + 1)]) != 0


def test_a_prompt_longer_than_the_positions_can_hold_is_refused_without_tokenizing_it(tokenizers):
    encoded = []
    adapter = types.SimpleNamespace(
        tokenizer=tokenizers["default"], reads_images=False, eos_token_ids=[2],
        model=types.SimpleNamespace(config=types.SimpleNamespace(
            get_text_config=lambda: types.SimpleNamespace(max_position_embeddings=512))),
        encode_prompts=lambda *args: encoded.append(args), suppressed_token_ids=lambda: [])
    sample = Sample([{"role": "user", "content": "How many? " * 500_000}], [])
    with pytest.raises(ValueError, match="prompt text holds 5000000 characters, more than the model's 512 positions"):
        check_drawn_sample(adapter, sample, 24)
    findings = cheap_checks(adapter, [sample], 24)
    assert not findings[0].ok and "5000000 characters" in findings[0].detail and encoded == []
