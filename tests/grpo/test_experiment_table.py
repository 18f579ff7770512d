"""The experiment summary's accuracy by question type: every type any model's report names, one row per seed and
type; a report written before types were named (an older base evaluation) shows a dash, not a missing row."""

from __future__ import annotations

from vlm_grpo.experiment.table import by_type_lines


def kinds(**accuracy: float) -> dict:
    return {k: {"n": 10, "accuracy": a, "accuracy_se": 0.1} for k, a in accuracy.items()}


def test_rows_for_every_type_any_model_names():
    split = {"base": {"by_question_type": {}}, "sft": {"by_question_type": kinds(colour=1.0, kind=0.1)},
             "grpo": {"by_question_type": kinds(colour=1.0, kind=0.5)}}
    summary = {"pooled": {"test": {}, "ood": {}},
               "seeds": [{"seed": 3, "splits": {"test": split, "ood": {m: {"by_question_type": {}} for m in split}}}]}
    lines = by_type_lines(summary)
    assert "## test: accuracy by question type" in lines and not any("## ood" in line for line in lines)
    assert "| 3 | colour | 10 | - | 100.0 +/- 10.0 | 100.0 +/- 10.0 |" in lines
    assert "| 3 | kind | 10 | - | 10.0 +/- 10.0 | 50.0 +/- 10.0 |" in lines


def test_grpo_minus_sft_over_seeds_has_both_standard_errors():
    """The paired SEs combined see only the images' sampling; the seeds' spread shows a seed that gained nothing."""
    import math
    import statistics

    from vlm_grpo.experiment.table import pooled

    diffs, ses = [0.025, 0.175, 0.0], [0.015, 0.029, 0.0]
    results = [{"splits": {"test": {"base": {"accuracy": 0.0}, "sft": {"accuracy": 0.5}, "grpo": {"accuracy": 0.5 + d},
                                    "grpo_minus_sft": {"difference": d, "se": se}}}} for d, se in zip(diffs, ses)]
    d = pooled(results, "test")["grpo_minus_sft"]
    assert math.isclose(d["difference"], statistics.mean(diffs))
    assert math.isclose(d["se"], math.sqrt(sum(s * s for s in ses)) / 3)
    assert math.isclose(d["se_across_seeds"], statistics.stdev(diffs) / math.sqrt(3))
    assert d["z"] > 2 > d["z_across_seeds"]  # this run's held-out result: significant per image, not per seed
