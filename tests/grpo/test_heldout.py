"""Held-out evaluation inside runs: SFT's eval_every curve, GRPO's before/after check, and their charts."""

from __future__ import annotations

import json

from vlm_grpo.cli import main
from vlm_grpo.grpo.run_log import read_jsonl
from vlm_grpo.recipes import get_recipe

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "6", "--logging.progress", "false",
        "--eval.size", "3", "--eval-batch-size", "2"]


def test_grpo_evaluates_before_and_after_and_plots(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny:smolvlm", "--max-steps", "2", "--output-dir", str(out), "--eval.before-after",
                 "--logging.plot", "true", *FAST]) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 2]
    assert rows[0]["stage"] == "eval-before" and rows[-1]["stage"] == "eval-after"
    assert all("eval/accuracy" in rows[i] for i in (0, 3)) and "eval/accuracy" not in rows[1]
    for when in ("before", "after"):
        report = json.loads((out / f"eval-{when}.json").read_text())
        assert report["size"] == 3 and report["split"] == "test" and report["accuracy"] is not None
    assert {"heldout_accuracy.png", "reward.png", "overview.png"} <= {p.name for p in (out / "plots").iterdir()}


def test_grpo_without_before_after_logs_only_steps(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny:smolvlm", "--max-steps", "1", "--output-dir", str(out), *FAST]) == 0
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    assert not (out / "eval-before.json").exists() and not (out / "plots").exists()


def test_sft_eval_every_logs_a_held_out_curve(tmp_path):
    out = tmp_path / "sft"
    assert main(["sft", "--model", "tiny:qwen2_5_vl", "--max-steps", "3", "--eval-every", "2", "--output-dir", str(out),
                 *FAST]) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert ["eval/accuracy" in r for r in rows] == [False, True, True]  # every 2 steps and at the end


def test_shapes_short_reference_keeps_the_counts_and_earns_every_reward():
    recipe = get_recipe("shapes")
    chapter = recipe.build(split="train", size=4, seed=0)
    short = recipe.build(split="train", size=4, seed=0, reference="short")
    for a, b in zip(chapter, short):
        assert len(b.reference) < len(a.reference) and b.fields == a.fields
        assert b.reference.startswith(a.reference.split(" in the image")[0])
        scores = {r.name: r.fn([b.reference], **{k: [v] for k, v in b.fields.items()})[0] for r in recipe.rewards}
        assert scores == {"correctness": 1.0, "description": 0.5, "reasoning": 0.2}
