"""Held-out evaluation inside runs: SFT's eval_every curve, GRPO's before/after check, and their charts."""

from __future__ import annotations

import json

from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl
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
    pairs = (out / "before-after.txt").read_text()
    before, after = (json.loads((out / f"eval-{w}.json").read_text())["samples"] for w in ("before", "after"))
    for b, a in zip(before, after):  # every held-out sample, its question and both greedy answers
        assert f"#{b['index']} How many" in pairs and f"before{' [right]' if b['correct'] else ' [wrong]'}: {b['completion']}" in pairs
        assert f"after{' [right]' if a['correct'] else ' [wrong]'}:  {a['completion']}" in pairs


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


def test_shapes_reference_mix_is_deterministic_and_keeps_the_samples():
    recipe = get_recipe("shapes")
    plain = recipe.build(split="train", size=200, seed=0, reference="short")
    mixed = recipe.build(split="train", size=200, seed=0, reference={"bare": 0.8, "short": 0.2})
    again = recipe.build(split="train", size=200, seed=0, reference={"bare": 0.8, "short": 0.2})
    bare = [m.reference for m in mixed if m.reference == f"{m.fields['answer']}."]
    assert 0.7 < len(bare) / 200 < 0.9  # the asked share, drawn per sample
    for p, m, a in zip(plain, mixed, again):
        assert m.fields == p.fields and m.reference == a.reference
        assert m.reference in (p.reference, f"{p.fields['answer']}.")
    scores = {r.name: r.fn([bare[0]], **{k: [v] for k, v in mixed[0].fields.items()})[0] for r in recipe.rewards}
    assert scores["description"] == 0.0 and scores["reasoning"] == 0.0


def test_shapes_short_reference_keeps_the_counts_and_earns_every_reward():
    recipe = get_recipe("shapes")
    chapter = recipe.build(split="train", size=4, seed=0)
    short = recipe.build(split="train", size=4, seed=0, reference="short")
    for a, b in zip(chapter, short):
        assert len(b.reference) < len(a.reference) and b.fields == a.fields
        assert b.reference.startswith(a.reference.split(" in the image")[0])
        scores = {r.name: r.fn([b.reference], **{k: [v] for k, v in b.fields.items()})[0] for r in recipe.rewards}
        assert scores == {"correctness": 1.0, "description": 0.5, "reasoning": 0.2}
