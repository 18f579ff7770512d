"""An evaluation's accuracy statistics: standard error, Wilson interval (scipy's binomial test as the reference),
the paired GRPO - SFT difference, and image reliance (answers again with blanked images)."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import binomtest

from tests.conftest import tiny_adapter
from vlm_grpo.grpo.eval_stats import accuracy_stats, binomial_se, paired_difference, wilson_interval
from vlm_grpo.grpo.heldout_eval import evaluate, format_report
from vlm_grpo.recipes import get_recipe


@pytest.mark.parametrize("hits,n", [(0, 10), (8, 10), (10, 10), (131, 400), (57, 60)])
def test_wilson_interval_equals_scipys(hits, n):
    ours = wilson_interval(hits, n)
    ref = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert ours == pytest.approx((ref.low, ref.high), abs=1e-9)
    assert ours[0] <= hits / n <= ours[1]


def test_standard_error_and_the_report_fields():
    assert binomial_se(30, 120) == pytest.approx(math.sqrt(0.25 * 0.75 / 120))
    assert binomial_se(0, 5) == 0.0
    stats = accuracy_stats([True, False, True, True])
    assert stats["accuracy"] == 0.75 and stats["accuracy_se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    assert len(stats["accuracy_ci95"]) == 2
    with pytest.raises(ValueError):
        binomial_se(0, 0)


def report(correct: dict[int, bool]) -> dict:
    rows = list(correct.items())
    random.Random(len(rows)).shuffle(rows)  # pairing goes by sample index, not by position
    return {"samples": [{"index": i, "correct": c} for i, c in rows]}


def test_paired_difference_pairs_samples_by_index():
    rng = random.Random(3)
    before = {i: rng.random() < 0.5 for i in range(200)}
    after = {i: (c or rng.random() < 0.3) if rng.random() < 0.9 else not c for i, c in before.items()}
    got = paired_difference(report(before), report(after))
    diffs = [int(after[i]) - int(before[i]) for i in range(200)]
    mean = sum(diffs) / 200
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 199)
    assert got["n"] == 200 and got["difference"] == pytest.approx(mean)
    assert got["se"] == pytest.approx(sd / math.sqrt(200)) and got["z"] == pytest.approx(mean / got["se"])
    assert got["gained"] == sum(d > 0 for d in diffs) and got["lost"] == sum(d < 0 for d in diffs)
    assert got["ci95"][0] < mean < got["ci95"][1]
    # pairing is what makes the error small: the unpaired error of two such accuracies is larger
    p1, p2 = sum(before.values()) / 200, sum(after.values()) / 200
    assert got["se"] < math.sqrt(p1 * (1 - p1) / 200 + p2 * (1 - p2) / 200)


def test_paired_difference_needs_shared_samples():
    with pytest.raises(ValueError, match="at least two samples"):
        paired_difference(report({0: True, 1: False}), report({2: True, 3: True}))


def test_evaluate_with_image_reliance_answers_the_blanked_images_too(monkeypatch):
    adapter = tiny_adapter("qwen2_5_vl")
    recipe = get_recipe("scene_count")
    seen = []
    encode = adapter.encode_prompts
    monkeypatch.setattr(adapter, "encode_prompts",
                        lambda prompts, images, *a, **k: seen.append(images) or encode(prompts, images, *a, **k))
    plain = evaluate(adapter, recipe, split="test", size=4, batch_size=4, max_new_tokens=6,
                     recipe_options={"image_size": 56})
    assert "image_reliance" not in plain
    out = evaluate(adapter, recipe, split="test", size=4, batch_size=4, max_new_tokens=6,
                   recipe_options={"image_size": 56}, image_reliance=True)
    assert [s["completion"] for s in out["samples"]] == [s["completion"] for s in plain["samples"]]
    reliance = out["image_reliance"]
    assert 0 <= reliance["blank_accuracy"] <= 1 and 0 <= reliance["answers_changed"] <= 1
    assert reliance["accuracy_drop"] == pytest.approx(out["accuracy"] - reliance["blank_accuracy"])
    # the second pass answered the same samples with each image one flat colour (its mean)
    assert len(seen) == 3
    for image, blank in zip(seen[1], seen[2]):  # per sample: its list of images
        assert blank[0].size == image[0].size and len(set(blank[0].getdata())) == 1 and len(set(image[0].getdata())) > 1
    text = format_report(out)
    assert "95% interval (Wilson)" in text and "images blanked" in text
