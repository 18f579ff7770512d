"""The monitors' rules on made-up step statistics: what trips each, what does not (noise, a slow or absent trend)."""

from __future__ import annotations

from vlm_grpo.grpo.settings.sections import GuardConfig
from vlm_grpo.grpo.guards.hacking_monitors import RelianceFalling, RisingWithoutAccuracy, monitors
from vlm_grpo.grpo.guards.hacking_watch import enumerates

CFG = GuardConfig(monitor_window=6)


def feed(monitor, series: list[dict]) -> list[int]:
    """The steps (1-based) at which `monitor` tripped."""
    return [k + 1 for k, stats in enumerate(series) if monitor.observe(k + 1, stats, {})]


def steps(n: int, **keys) -> list[dict]:
    return [{key: (values[k] if isinstance(values, list) else values) for key, values in keys.items()} for k in range(n)]


def test_a_rising_component_trips_only_while_accuracy_is_flat():
    rising = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    flat = steps(6, **{"rewards/format": rising, "max/format": 1.0, "guards/accuracy_rate": 0.3, "n/completions": 128})
    assert feed(RisingWithoutAccuracy(CFG, "accuracy"), flat) == [6]  # judged once the window holds 6 steps
    improving = steps(6, **{"rewards/format": rising, "max/format": 1.0, "n/completions": 128,
                            "guards/accuracy_rate": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    assert feed(RisingWithoutAccuracy(CFG, "accuracy"), improving) == []  # the answers got better too
    slow = steps(6, **{"rewards/format": [0.0, 0.02, 0.04, 0.06, 0.08, 0.1], "max/format": 1.0,
                       "guards/accuracy_rate": 0.3, "n/completions": 128})
    assert feed(RisingWithoutAccuracy(CFG, "accuracy"), slow) == []  # 8% of its largest value: below 30%
    # 8 completions a step: a 25-point swing of the accuracy rate is sampling noise, not a change
    noisy = steps(6, **{"rewards/format": rising, "max/format": 1.0, "n/completions": 8,
                        "guards/accuracy_rate": [0.5, 0.5, 0.4, 0.6, 0.25, 0.25]})
    assert feed(RisingWithoutAccuracy(CFG, "accuracy"), noisy) == [6]
    assert feed(RisingWithoutAccuracy(CFG, None), flat) == []  # no accuracy reward: nothing to compare with


def test_image_reliance_trips_on_a_sustained_fall_or_none_at_all():
    def measured(values):
        return [{"grounding/image_reliance": v} for v in values]

    assert feed(RelianceFalling(CFG), measured([1.0, 1.2, 0.8, 0.2, 1.0, 0.9])) == []  # one noisy dip
    assert feed(RelianceFalling(CFG), measured([1.0, 1.2, 0.8, 0.3, 0.2, 0.1])) == [6]  # mean 0.2 < 0.25 x 1.0
    assert feed(RelianceFalling(CFG), measured([0.001])) == [1]  # the answers never needed the image
    restored = RelianceFalling(CFG)
    restored.load_state_dict(RelianceFalling(CFG).state_dict() | {"values": [1.0, 1.2, 0.8, 0.3, 0.2]})
    assert feed(restored, measured([0.1])) == [1]  # the history travels in checkpoints


def test_shares_that_rise_and_groups_that_collapse():
    made = monitors(CFG, "accuracy", fixed_length=False).by_name
    enumeration = steps(6, **{"guards/enumeration": [0.0, 0.0, 0.1, 0.2, 0.4, 0.5]})
    assert feed(made["enumeration"], enumeration) == [6]
    capped_from_the_start = steps(6, **{"guards/at_length_limit": 1.0})  # a model that never stops: no drift
    assert feed(made["length_limit"], capped_from_the_start) == []
    drifting = steps(6, **{"guards/at_length_limit": [0.1, 0.2, 0.4, 0.5, 0.7, 0.8]})
    assert feed(monitors(CFG, "accuracy", fixed_length=False).by_name["length_limit"], drifting) == [6]
    assert "length_limit" not in monitors(CFG, "accuracy", fixed_length=True).by_name  # benchmarks: fixed-length completions
    identical = steps(4, **{"guards/identical_groups": [0.6, 0.2, 0.7, 0.9]})
    assert feed(made["identical_groups"], identical) == [4]  # two steps in a row


def test_what_counts_as_enumerating_answers():
    counts = [str(k) for k in range(1, 6)]
    assert enumerates("1 2 3 4 5", counts) and enumerates("maybe 2, 3 or 4", counts)
    assert not enumerates("So the number of squares is 3", counts) and not enumerates("12 or 34", counts)
    assert enumerates("True False", ["True", "False"]) and not enumerates("true", ["True", "False"])


def test_the_answer_marginal_per_question_type():
    """The share of the commonest stated answer among a step's completions, over all and per question type: a
    policy saying "triangle" to every shape question shows 1.0 there, whatever the colour questions do; beside it the
    share the commonest right answer holds among the same prompts, what a policy right on every prompt would show."""
    from types import SimpleNamespace

    from vlm_grpo.grpo.guards.hacking_watch import answer_marginal, stated_answers
    from vlm_grpo.recipes.audit_hints import DEFAULT_HINTS

    samples = [SimpleNamespace(fields={"question_type": "kind", "answer": "Triangle"}),
               SimpleNamespace(fields={"question_type": "colour", "answer": "red"}), SimpleNamespace(fields={})]
    completions = ["<think>x</think>\n<answer>Triangle</answer>", "<answer> triangle </answer>",
                   "<think>y</think>\n<answer>red</answer>", "<answer>blue</answer>", "<answer>red</answer>", "no tags"]
    rows = stated_answers(SimpleNamespace(num_generations=2, completions=completions), samples, DEFAULT_HINTS)
    assert [r["type"] for r in rows] == ["kind", "kind", "colour", "colour", "", ""]
    assert [r["answer"] for r in rows[:2]] == ["triangle", "triangle"]
    assert [r["right"] for r in rows] == ["triangle", "triangle", "red", "red", None, None]
    shares = answer_marginal(rows)
    # the third prompt names no right answer: no right-answer share over all; each type's prompts all name theirs
    assert shares == {"guards/answer_share": 2 / 6, "guards/answer_share/kind": 1.0, "guards/answer_share/colour": 0.5,
                      "guards/right_answer_share/kind": 1.0, "guards/right_answer_share/colour": 1.0}
    assert answer_marginal([{"type": "count all", "answer": "1", "right": "2"}]) == {
        "guards/answer_share": 1.0, "guards/answer_share/count_all": 1.0,
        "guards/right_answer_share": 1.0, "guards/right_answer_share/count_all": 1.0}
    four = [{"type": "kind", "answer": "square", "right": r} for r in ("square", "circle", "circle", "triangle")]
    assert answer_marginal(four)["guards/right_answer_share/kind"] == 0.5  # a drift to "square": 1.0 against 0.5
    assert answer_marginal([]) == {}
