"""The inverse-CDF sampler draws from exactly the distribution generate()'s own sampling draws from.

The oracle is HF itself: generate() with its multinomial sampling and `output_scores=True` returns the processed
scores it sampled from (suppression, min_new_tokens' EOS mask, temperature, top-k, top-p), so softmax of them is
HF's sampling distribution. Many draws (of the sampler on the prompt's raw logits, and of the rollout's generation
path end to end) are compared with it, per token and as a whole, with bounds derived from the number of draws; and
with HF's own draws at the same sample size.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.adapters.samples import picture, user_turn
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.adapters.sampler import InverseCdfSampler, inverse_cdf_draw
from vlm_grpo.adapters.sharing import generate_shared

DRAWS = 20_000
SIGMAS = 5.0  # per-token bound: a false alarm at 5 sigma over ~500 tokens has odds of about 1 in 4,000
CONFIGS = [(1.0, 0, 1.0, 0), (0.7, 40, 1.0, 1), (1.3, 0, 0.8, 0), (0.9, 60, 0.9, 1)]  # temperature, top-k, top-p, min


def _peaked_adapter():
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    with torch.no_grad():  # a random tiny head is near-uniform: sharpen it so temperature and top-k/p matter
        adapter.model.get_output_embeddings().weight.mul_(8.0)
    return adapter


def _settings(temperature, top_k, top_p, min_new_tokens):
    return dict(max_new_tokens=1, min_new_tokens=min_new_tokens, do_sample=True, temperature=temperature,
                top_k=top_k, top_p=top_p, use_cache=True)


def _hf_oracle(adapter, batch, settings):
    """(raw next-token logits, the probabilities HF samples them from) for the prompt: generate() with its own
    sampling reports both (`output_logits`, `output_scores`: the scores after all of its processors)."""
    with torch.no_grad():
        out = adapter.model.generate(**adapter.model_inputs(batch), output_scores=True,
                                     **adapter.generation_kwargs(sampler="multinomial", output_logits=True, **settings))
    probs = torch.softmax(out.scores[0][0].double(), -1)
    assert probs[adapter.suppressed_token_ids()].sum() == 0
    eos = probs[adapter.eos_token_ids].sum()
    assert eos == 0 if settings["min_new_tokens"] else (eos > 0 or settings["top_k"] or settings["top_p"] < 1)
    assert int((probs > 0).sum()) > 20 and probs.max() < 0.5  # a distribution worth testing
    return out.logits[0][0], probs


def _counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double()


def _check_draws(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """Counts of draws against exact probabilities: impossible tokens never drawn, every token within SIGMAS
    binomial standard deviations, and Pearson's chi-square within SIGMAS of its mean (df) over the tokens that can
    be drawn."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0
    expected = probs * n
    sd = (n * probs * (1 - probs)).sqrt()
    assert ((counts - expected).abs() <= SIGMAS * sd + 1).all(), ((counts - expected).abs() / sd.clamp(min=1e-9)).max()
    live = probs > 0
    df = int(live.sum()) - 1
    chi2 = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    assert chi2 <= df + SIGMAS * math.sqrt(2 * df), (chi2, df)


@pytest.mark.parametrize("config", CONFIGS)
def test_the_sampler_draws_from_hf_sampling_distribution(config):
    """The processor generate() runs, fed the prompt's raw logits DRAWS times."""
    adapter = _peaked_adapter()
    batch = adapter.encode_prompts([user_turn(0, "Describe the picture.")], [[]])
    settings = _settings(*config)
    logits, probs = _hf_oracle(adapter, batch, settings)
    kwargs = adapter.generation_kwargs(**settings)
    assert kwargs["do_sample"] is False and kwargs["suppress_tokens"] is None  # the draw is the processor's
    (sampler,) = kwargs["logits_processor"]
    torch.manual_seed(1)
    assert sampler.in_place  # generate() passes scores it does not keep (no output_logits)
    chosen = sampler(batch.input_ids.expand(DRAWS, -1), logits.expand(DRAWS, -1).clone()).argmax(-1)
    _check_draws(_counts(chosen, len(probs)), probs)


def test_rollout_draws_follow_hf_sampling_distribution():
    """End to end through the rollout's generation (one prompt prefilled once, DRAWS completions), against HF's
    distribution and against HF's own draws at the same sample size."""
    adapter = _peaked_adapter()
    batch = adapter.encode_prompts([user_turn(0, "Describe the picture.")], [[]])
    settings = _settings(*CONFIGS[-1])
    _, probs = _hf_oracle(adapter, batch, settings)
    counts = {}
    for seed, sampler in enumerate(("inverse_cdf", "multinomial")):
        torch.manual_seed(seed)
        out = generate_shared(adapter, batch, DRAWS, **settings, sampler=sampler)
        assert out.shared
        counts[sampler] = _counts(out.output.sequences[:, -1], len(probs))
        _check_draws(counts[sampler], probs)  # the oracle and the bound hold for HF's own sampler too
    gap = (counts["inverse_cdf"] - counts["multinomial"]).abs() / DRAWS
    assert (gap <= SIGMAS * (2 * probs * (1 - probs) / DRAWS).sqrt() + 2 / DRAWS).all()


def test_min_new_tokens_counts_from_the_prompt_and_the_scores_are_left_alone():
    """EOS ids are masked for exactly min_new_tokens steps after the prompt (the first call's length), then drawn
    at their softmax rate; suppressed ids never are; generate() gets -inf everywhere but at the drawn token, and
    its own scores are not written into."""
    sampler = InverseCdfSampler(suppressed_ids=[3], eos_token_ids=[5, 6], min_new_tokens=2)
    scores = torch.zeros(DRAWS, 10)
    scores[:, 5], scores[:, 6] = 2.0, 1.0  # EOS ids likely
    kept = scores.clone()
    torch.manual_seed(0)
    for step in range(4):
        out = sampler(torch.zeros(DRAWS, 7 + step, dtype=torch.long), scores)
        assert torch.equal(scores, kept)
        assert ((out == 0).sum(-1) == 1).all() and (torch.isinf(out).sum(-1) == 9).all()
        masked = kept[0].clone()
        masked[[3, 5, 6] if step < 2 else [3]] = float("-inf")
        _check_draws(_counts(out.argmax(-1), 10), torch.softmax(masked.double(), -1))


def test_inverse_cdf_draw_matches_softmax_and_refuses_empty_rows():
    torch.manual_seed(0)
    for vocab in (1, 7, 150, 1001):  # block sizes that divide the vocabulary and ones that leave a short last block
        logits = torch.randn(vocab) * 3
        logits[torch.randperm(vocab)[: vocab // 3]] = float("-inf")
        if torch.isinf(logits).all():
            logits[0] = 0.0
        tokens = inverse_cdf_draw(logits.expand(DRAWS, vocab).contiguous())
        _check_draws(_counts(tokens, vocab), torch.softmax(logits.double(), -1))
    scores = torch.zeros(3, 5)
    scores[1] = float("-inf")
    with pytest.raises(ValueError, match="row 1 has no token left to draw"):
        inverse_cdf_draw(scores)


def test_greedy_generation_is_generate_own_bit_for_bit():
    """The greedy path (evaluation, the cache probe) is untouched: the same tokens and logits as a plain generate()
    with the same suppression, EOS and min_new_tokens settings."""
    adapter = _peaked_adapter()
    batch = adapter.encode_prompts([user_turn(1, "How many red squares?")], [[picture(56, 56, 1)]])
    for min_new in (0, 3):
        ours = adapter.generate(batch, max_new_tokens=6, min_new_tokens=min_new, output_logits=True)
        with torch.no_grad():
            plain = adapter.model.generate(**adapter.model_inputs(batch), max_new_tokens=6, min_new_tokens=min_new,
                                           do_sample=False, suppress_tokens=adapter.suppressed_token_ids(),
                                           eos_token_id=adapter.eos_token_ids, pad_token_id=adapter.pad_token_id,
                                           return_dict_in_generate=True, output_logits=True)
        assert torch.equal(ours.sequences, plain.sequences)
        assert all(torch.equal(a, b) for a, b in zip(ours.logits, plain.logits, strict=True))
