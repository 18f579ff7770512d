"""`vlm-grpo bench --lengths`: completions end at lengths drawn per row, in both frameworks alike (the two
frameworks' runs: tests/bench/test_bench.py)."""

from __future__ import annotations

import random

import pytest
import torch

from vlm_grpo.bench.lengths import LengthPlan, Lengths, end_generations_at, parse_lengths
from vlm_grpo.cli import main
from vlm_grpo.loader import load_model
from vlm_grpo.recipes.base import user_turn


@pytest.mark.parametrize("text, why", [
    ("uniform:0:8", "1 <= LO <= HI"), ("uniform:9:8", "1 <= LO <= HI"), ("longtail:4:99", "1 <= LO <= HI"),
    ("uniform:4", "use fixed, uniform"), ("normal:4:8", "use fixed, uniform"), ("uniform:a:8", "use fixed, uniform"),
    ("fixed:8", "use fixed, uniform"),
])
def test_a_spelling_that_draws_no_length_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        parse_lengths(text, max_new_tokens=64)


def test_uniform_spans_its_range_and_longtail_is_mostly_short():
    rng = random.Random(0)
    uniform = [parse_lengths("uniform:16:512", 512).draw(rng) for _ in range(4000)]
    longtail = [parse_lengths("longtail:16:512", 512).draw(rng) for _ in range(4000)]
    assert min(uniform) == 16 and max(uniform) == 512 and 230 < sum(uniform) / 4000 < 300
    assert min(longtail) >= 16 and max(longtail) <= 512
    assert sorted(longtail)[2000] < 110 < sorted(uniform)[2000]  # the median: log-uniform's is sqrt(16 * 513) ~ 91


def test_each_row_ends_with_eos_at_its_drawn_length():
    adapter = load_model("tiny:qwen2_5_vl", device="cpu", decide_cache=False)
    from PIL import Image

    batch = adapter.encode_prompts([user_turn("Count.")] * 2, [[Image.new("RGB", (56, 56), c)] for c in ("red", "blue")])
    plan = LengthPlan(Lengths("uniform", 1, 7), seed=3)
    eos = adapter.eos_token_ids[0]
    end_generations_at(adapter.model, plan, eos)
    for sampler in ("inverse_cdf", "multinomial"):  # the ender comes before vlm-grpo's own draw
        out = adapter.generate(batch.repeat(3), max_new_tokens=7, do_sample=True, sampler=sampler)
        completions = out.sequences[:, batch.input_ids.shape[1]:]
        wanted = plan.drawn[-6:]
        for row, length in zip(completions, wanted):
            ends = (row == eos).nonzero().flatten().tolist()
            assert ends and ends[0] == length - 1, (row.tolist(), length)  # no EOS before, EOS as the last token
    assert len(plan.drawn) == 12 and len(set(plan.drawn)) > 1


def test_lengths_the_frameworks_cannot_draw_are_refused_before_anything_runs(capsys):
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--lengths", "uniform:1:99", "--max-new-tokens", "8"]) == 2
    assert "--lengths 'uniform:1:99': need 1 <= LO <= HI <= --max-new-tokens (8)" in capsys.readouterr().err
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--lengths", "uniform:1:8", "--max-new-tokens", "8",
                 "--engine", "vllm", "--frameworks", "vlm-grpo"]) != 0
