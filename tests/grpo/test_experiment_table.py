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
