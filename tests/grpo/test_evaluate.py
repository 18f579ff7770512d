"""Greedy evaluation: reward means, accuracy, and accuracy by reasoning-length bucket."""

from __future__ import annotations

import json

from tests.conftest import tiny_adapter
from vlm_grpo.cli import main
from vlm_grpo.grpo.heldout_eval import by_question_type, evaluate, format_report, inverted_u, length_buckets, quartile_edges, summarize
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.base import Recipe, Reward


def odd_length(completions, **_):
    """A stand-in for correctness that random weights pass about half the time."""
    return [float(len(c) % 2) for c in completions]


def toy_recipe() -> Recipe:
    shapes = get_recipe("shapes")
    return Recipe(name="toy", build=shapes.build, rewards=[*shapes.rewards, Reward("odd", odd_length, 0.5)],
                  accuracy_reward="odd")


def stop_tokens_for_varied_lengths(adapter, n: int) -> list[int]:
    """Random weights never say EOS: pick stop ids from a first greedy pass so rows stop at different lengths."""
    data = get_recipe("shapes").build(split="test", size=n, seed=0, image_size=56)
    batch = adapter.encode_prompts([data[i].prompt for i in range(n)], [data[i].images for i in range(n)])
    ids = adapter.generate(batch, max_new_tokens=12).sequences[:, batch.input_ids.shape[1]:]
    opening = set(ids[:, :4].flatten().tolist())
    return sorted({int(ids[r, min(4 + r, 11)]) for r in range(n)} - opening)


def test_evaluate_fields_buckets_and_accuracy(monkeypatch):
    adapter = tiny_adapter("qwen2_5_vl")
    stops = stop_tokens_for_varied_lengths(adapter, 10)
    monkeypatch.setattr(type(adapter), "eos_token_ids", property(lambda self: stops))
    adapter.model.train()
    report = evaluate(adapter, toy_recipe(), split="test", size=10, seed=0, batch_size=4, max_new_tokens=12,
                      recipe_options={"image_size": 56})
    assert adapter.model.training  # the caller's mode is restored
    for key in ("split", "size", "reward", "rewards", "accuracy", "accuracy_reward", "completion_length",
                "length_buckets", "inverted_u", "samples"):
        assert key in report, key
    samples = report["samples"]
    assert report["size"] == len(samples) == 10
    assert [s["index"] for s in samples] == list(range(10))
    assert set(report["rewards"]) == {"correctness", "description", "reasoning", "odd"}
    # accuracy recomputed independently from the per-sample records
    assert report["accuracy"] == sum(s["rewards"]["odd"] > 0 for s in samples) / 10
    for name, mean in report["rewards"].items():
        assert abs(mean - sum(s["rewards"][name] for s in samples) / 10) < 1e-9
    assert abs(report["completion_length"] - sum(s["length"] for s in samples) / 10) < 1e-9
    assert all(1 <= s["length"] <= 12 for s in samples)
    assert len({s["length"] for s in samples}) >= 2 and any(not s["truncated"] for s in samples)
    buckets = report["length_buckets"]
    assert sum(b["count"] for b in buckets) == 10 and sum(b["count"] > 0 for b in buckets) >= 2
    for b in buckets:
        inside = [s for s in samples if s["length"] >= b["low"] and (b["high"] is None or s["length"] < b["high"])]
        assert b["count"] == len(inside)
        if inside:
            assert b["accuracy"] == sum(s["rewards"]["odd"] > 0 for s in inside) / len(inside)
    # greedy: the same call gives the same completions
    again = evaluate(adapter, toy_recipe(), split="test", size=3, seed=0, batch_size=3, max_new_tokens=12,
                     recipe_options={"image_size": 56})
    assert [s["completion"] for s in again["samples"]] == [s["completion"] for s in samples[:3]]


def test_length_buckets_quartiles_edges_and_inverted_u():
    lengths = [2, 4, 6, 8, 10, 12, 14, 16]
    assert quartile_edges(lengths) == [6, 10, 14]
    correct = [False, False, True, True, True, True, False, False]
    buckets = length_buckets(lengths, correct)
    assert [b["count"] for b in buckets] == [2, 2, 2, 2]
    assert [b["accuracy"] for b in buckets] == [0.0, 1.0, 1.0, 0.0]
    assert inverted_u(buckets) is True
    fixed = length_buckets(lengths, correct, edges=[5, 100])
    assert [(b["low"], b["high"], b["count"]) for b in fixed] == [(0, 5, 2), (5, 100, 6), (100, None, 0)]
    rising = length_buckets(lengths, [False] * 4 + [True] * 4)
    assert inverted_u(rising) is False
    same = length_buckets([7] * 5, [True] * 5)
    assert [b["count"] for b in same] == [5] and inverted_u(same) is None


def test_eval_command_writes_json(tmp_path, capsys):
    code = main(["eval", "--model", "tiny:smolvlm", "--recipe", "shapes", "--split", "test", "--size", "4",
                 "--max-new-tokens", "6", "--output-dir", str(tmp_path), "--data.recipe_options", "{image_size: 56}"])
    assert code == 0
    report = json.loads((tmp_path / "eval-test.json").read_text())
    assert report["size"] == 4 and report["accuracy_reward"] == "correctness" and report["model"] == "tiny:smolvlm"
    assert report["accuracy"] == sum(s["rewards"]["correctness"] > 0 for s in report["samples"]) / 4
    assert "length (tokens)" in capsys.readouterr().out
    out = tmp_path / "sub" / "e.json"
    assert main(["eval", "--model", "tiny:smolvlm", "--size", "2", "--max-new-tokens", "4", "--out", str(out),
                 "--length-edges", "2,4", "--data.recipe_options", "{image_size: 56}"]) == 0
    assert [b["bucket"] for b in json.loads(out.read_text())["length_buckets"]] == ["[0, 2)", "[2, 4)", "[4, inf)"]


def test_accuracy_by_question_type_where_the_recipe_names_it():
    """A mean can hide a kind of question never answered: each type's accuracy, counted from the records."""
    records = [{"index": i, "length": 5, "truncated": False, "reward": 1.0, "rewards": {"ok": 1.0},
                "correct": correct, "question_type": kind}
               for i, (kind, correct) in enumerate([("colour", True)] * 6 + [("kind", True)] + [("kind", False)] * 3)]
    report = summarize(records, ["ok"], "ok", split="test")
    assert report["accuracy"] == 0.7
    assert report["by_question_type"]["colour"]["accuracy"] == 1.0 and report["by_question_type"]["colour"]["n"] == 6
    assert report["by_question_type"]["kind"]["accuracy"] == 0.25 and report["by_question_type"]["kind"]["n"] == 4
    assert report["by_question_type"]["kind"]["accuracy_se"] > 0
    assert "accuracy on kind questions  0.250" in format_report(report)
    untyped = [{k: v for k, v in r.items() if k != "question_type"} for r in records]
    assert by_question_type(untyped) == {} and summarize(untyped, ["ok"], "ok")["by_question_type"] == {}


def test_each_record_keeps_its_answer_and_its_blanked_result():
    """Image-dependent accuracy is paired question by question (the answer with the image against the answer with
    it blanked), and the constant-answer baseline counts the right answers: both are in every record."""
    adapter = tiny_adapter("qwen2_5_vl")
    recipe = Recipe(name="toy", build=get_recipe("scene_count").build,
                    rewards=[Reward("odd", odd_length)], accuracy_reward="odd")
    options = {"task": "attribute", "image_size": 56}
    report = evaluate(adapter, recipe, split="val", size=4, seed=0, batch_size=4, max_new_tokens=3,
                      recipe_options=options, image_reliance=True)
    data = get_recipe("scene_count").build(split="val", size=4, seed=0, **options)
    assert [r["answer"] for r in report["samples"]] == [data[i].fields["answer"] for i in range(4)]
    assert all(isinstance(r["blank_correct"], bool) for r in report["samples"])
    blank = sum(r["blank_correct"] for r in report["samples"]) / 4
    assert report["image_reliance"]["blank_accuracy"] == blank
    plain = evaluate(adapter, recipe, split="val", size=2, seed=0, batch_size=2, max_new_tokens=3, recipe_options=options)
    assert all("blank_correct" not in r for r in plain["samples"])
