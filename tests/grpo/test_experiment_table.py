"""The experiment's table: per split and question type, accuracy and image-dependent accuracy with SEs clustered by
question (the seeds share the questions) and a t-interval across seeds, the constant-answer baseline, each model's
commonest answer, and every GRPO model against the best control (vlm_grpo/experiment/stats.py, table.py)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.experiment.stats import beats, clustered_mean, commonest, difference, t_quantile
from vlm_grpo.experiment.table import across, markdown, split_table, stat


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 29, 30, 31, 45, 120])
def test_t_quantile_is_students(df):
    scipy_stats = pytest.importorskip("scipy.stats")
    assert t_quantile(df) == pytest.approx(float(scipy_stats.t.ppf(0.975, df)), abs=1.5e-3)


def test_t_quantile_refuses_a_single_seed():
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t_quantile(0)


def test_the_se_is_clustered_by_question_not_by_answer():
    """Three seeds that answer alike: pooling their 3 x 4 answers as independent would shrink the SE by sqrt(3); the
    clustered SE is the per-question means' SD over sqrt(questions), and the seeds' spread is zero."""
    seed = {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}
    s = clustered_mean([seed, dict(seed), dict(seed)])
    assert s["mean"] == 0.75 and s["questions"] == 4 and s["seeds"] == 3
    assert s["se_clustered"] == pytest.approx(statistics.stdev(seed.values()) / 2)
    naive = statistics.stdev([v for _ in range(3) for v in seed.values()]) / math.sqrt(12)
    assert s["se_clustered"] > 1.5 * naive
    assert s["across_seeds"]["df"] == 2 and s["across_seeds"]["se"] == 0.0


def test_the_seeds_t_interval_sees_a_seed_that_gained_nothing():
    """Per question the gain looks sure (+0.5 on every question of two seeds); one seed gained nothing, and the t
    interval with 2 degrees of freedom spans zero."""
    n = 40
    grpo = [{i: 1.0 for i in range(n)}, {i: 1.0 for i in range(n)}, {i: float(i % 2) for i in range(n)}]
    sft = [{i: float(i % 2) for i in range(n)} for _ in range(3)]
    d = difference(grpo, sft)
    assert d["per_seed"] == [0.5, 0.5, 0.0] and d["mean"] == pytest.approx(1 / 3)
    assert beats(d)  # clustered by question: significant
    low, high = d["across_seeds"]["ci95"]
    assert low < 0 < high and d["across_seeds"]["df"] == 2
    half = t_quantile(2) * statistics.stdev([0.5, 0.5, 0.0]) / math.sqrt(3)
    assert high - d["mean"] == pytest.approx(half)


def test_only_questions_every_seed_answered_count():
    s = clustered_mean([{0: 1.0, 1: 0.0, 2: 1.0}, {1: 1.0, 2: 1.0}])
    assert s["questions"] == 2 and s["mean"] == 0.75
    assert clustered_mean([{0: 1.0}, {1: 1.0}]) is None and clustered_mean([]) is None
    with pytest.raises(ValueError, match="the same seeds on both sides"):
        difference([{0: 1.0}], [{0: 1.0}, {0: 0.0}])


def test_commonest_answer_and_baseline():
    assert commonest(["triangle", "square", "triangle", "circle"]) == {"answer": "triangle", "share": 0.5, "n": 4}
    assert commonest([]) is None
    assert not beats(None) and not beats({"mean": 0.1, "se_clustered": 0.06}) and beats({"mean": 0.13, "se_clustered": 0.06})


def test_a_difference_that_rounds_to_zero_prints_without_a_sign_of_its_own():
    """-0.0004 is 0.0 points at one decimal: the table once printed it "-0.0" (a gain that was not a loss)."""
    assert stat({"mean": -0.0004, "se_clustered": 0.027}, signed=True) == "+0.0 +/- 2.7"
    assert stat({"mean": -0.0004, "se_clustered": None}) == "0.0"
    assert across({"across_seeds": {"ci95": [-0.0004, 0.1], "df": 2}}) == "[+0.0, +10.0] (df 2)"
    assert stat({"mean": -0.006, "se_clustered": 0.02}, signed=True) == "-0.6 +/- 2.0"


def rows(correct: list[int], blank: list[int], stated: list[str], answers: list[str], types: list[str]) -> list[dict]:
    return [{"index": i, "type": t, "answer": a, "stated": s, "correct": bool(c), "blank_correct": bool(b)}
            for i, (c, b, s, a, t) in enumerate(zip(correct, blank, stated, answers, types))]


TYPES = ["colour", "colour", "kind", "kind", "kind", "kind"]
ANSWERS = ["red", "blue", "triangle", "triangle", "square", "circle"]


def test_split_table_image_dependence_baseline_leaning_and_verdict(tmp_path):
    """GRPO answers every shape question "triangle": its accuracy on them equals the constant baseline and, with the
    image blanked, stays the same, so its image-dependent accuracy there is zero; the control that reads the image
    is the best control, and GRPO does not beat it."""
    exp = Experiment(source="x.yaml", name="x", output_dir=tmp_path, base_seed=0, compose={}, stages={},
                     eval={"splits": ["val"]}, arms={"rft": {"method": "rft", "set": {}, "question_types": None}})
    sft = rows([1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], ["red", "blue", "red", "red", "red", "red"], ANSWERS, TYPES)
    grpo = rows([1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0], ["red", "blue", *["triangle"] * 4], ANSWERS, TYPES)
    rft = rows([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], ["red", "blue", "triangle", "triangle", "square", "square"],
               ANSWERS, TYPES)
    base = rows([0] * 6, [0] * 6, ["x"] * 6, ANSWERS, TYPES)
    by = {"base": base, "sft": sft, "grpo": grpo, "rft": rft}
    table = split_table(exp, [0, 1], "val", {(s, m): r for s in (0, 1) for m, r in by.items()})
    assert table["role"] == "validation" and table["kinds"] == ["colour", "kind"]
    assert table["baseline"]["by_type"]["kind"] == {"answer": "triangle", "share": 0.5, "n": 4}
    kind = table["models"]["grpo"]["by_type"]["kind"]
    assert kind["accuracy"]["mean"] == 0.5 and kind["image_dependent"]["mean"] == 0.0
    assert kind["commonest_answer"][0] == {"answer": "triangle", "share": 1.0, "n": 4}
    assert table["models"]["rft"]["by_type"]["kind"]["image_dependent"]["mean"] == 0.75
    assert table["comparisons"]["grpo - sft"]["by_type"]["kind"]["accuracy"]["mean"] == 0.5
    assert table["comparisons"]["grpo - rft"]["all"]["image_dependent"]["mean"] == pytest.approx(-3 / 6)
    verdict = table["verdict"]
    assert verdict["best_control"] == "rft" and verdict["grpo"]["grpo"]["beats_by_2_se"] is False
    summary = {"experiment": "x", "config": "x.yaml", "written": "2026-11-28",
               "versions": {"commit": "abc", "torch": "2", "transformers": "5"}, "seeds": [0, 1],
               "independent_seeds": True, "splits": {"val": table}, "times": {0: {"sft": 1.0, "eval": None}},
               "monitor": {0: {"grpo": {w: {"steps": [s, s], "all": 0.5, "by_type": {"kind": 0.9}} for w, s in
                                        (("first", 1), ("middle", 2), ("last", 3))}}}, "changed": []}
    text = markdown(summary)
    assert "## val (validation)" in text
    assert "**grpo - rft (the best control), image-dependent accuracy: -50.0" in text and "does not beat it" in text
    assert "| grpo | `kind` | 4 | 50.0 +/- 28.9 | 0.0 +/- 0.0 | 50.0 (`triangle`) | `triangle` 100.0, `triangle` 100.0 |" in text
    assert "| 0 | grpo | `kind` | 90.0 (step 1) | 90.0 (step 2) | 90.0 (step 3) |" in text
    assert "| 0 | grpo | all | 50.0 (step 1) | 50.0 (step 2) | 50.0 (step 3) |" in text
    assert "each seed composed and aligned its own tower and projector" in text


def test_a_question_type_named_like_the_total_keeps_its_own_row(tmp_path):
    """A recipe may call a question type "all" or "step": its figures stay its own, the total stays the total (the
    table once keyed both by the same name, and the type's figures replaced the total's)."""
    exp = Experiment(source="x.yaml", name="x", output_dir=tmp_path, base_seed=0, compose={}, stages={},
                     eval={"splits": ["val"]})
    types = ["all", "all", "step", "step", "step", "step"]
    by = {m: rows(c, [0] * 6, ["a"] * 6, ANSWERS, types) for m, c in
          {"base": [0] * 6, "sft": [1, 1, 0, 0, 0, 0], "grpo": [1, 1, 1, 1, 1, 1]}.items()}
    table = split_table(exp, [0], "val", {(0, m): r for m, r in by.items()})
    assert table["kinds"] == ["all", "step"]
    sft = table["models"]["sft"]
    assert sft["all"]["accuracy"]["mean"] == pytest.approx(2 / 6) and sft["all"]["accuracy"]["questions"] == 6
    assert sft["by_type"]["all"]["accuracy"]["mean"] == 1.0 and sft["by_type"]["step"]["accuracy"]["mean"] == 0.0
    assert table["comparisons"]["grpo - sft"]["all"]["accuracy"]["mean"] == pytest.approx(4 / 6)
    summary = {"experiment": "x", "config": "x.yaml", "written": "2026-11-28",
               "versions": {"commit": "abc", "torch": "2", "transformers": "5"}, "seeds": [0],
               "independent_seeds": True, "splits": {"val": table}, "times": {0: {"sft": 1.0}},
               "monitor": {0: {"grpo": {w: {"steps": [7, 16], "all": 0.25, "by_type": {"all": 1.0, "steps": 0.5}}
                                        for w in ("first", "middle", "last")}}}, "changed": []}
    text = markdown(summary)
    assert "| sft | all | 6 | 33.3 +/- " in text and "| sft | `all` | 2 | 100.0 +/- " in text
    assert "| sft | `step` | 4 | 0.0 +/- " in text
    assert "| 0 | grpo | all | 25.0 (steps 7-16) |" in text and "| 0 | grpo | `all` | 100.0 (steps 7-16) |" in text
    assert "| 0 | grpo | `steps` | 50.0 (steps 7-16) |" in text


def test_the_answer_marginal_is_averaged_over_windows_of_steps(tmp_path):
    """One step's share is of a handful of prompts: the summary gives the mean of the first, middle and last ten
    steps (a type a step did not ask is left out of that step's mean, not counted as 0)."""
    from vlm_grpo.experiment.table import monitor, monitor_lines

    exp = Experiment(source="x.yaml", name="x", output_dir=tmp_path, base_seed=0, compose={}, stages={},
                     eval={"splits": ["val"]})
    grpo = exp.stage_dir("grpo", 0)
    grpo.mkdir(parents=True)
    steps = [{"step": n, "loss": 0.1, "guards/answer_share": 0.25 if n % 2 else 0.75,
              **({"guards/answer_share/kind": n / 100, "guards/right_answer_share/kind": 0.5} if n % 3 else {})}
             for n in range(1, 101)]
    (grpo / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in [*steps, {"step": 100, "eval": 1}]))
    points = monitor(exp, 0)["grpo"]
    assert [points[w]["steps"] for w in ("first", "middle", "last")] == [[1, 10], [46, 55], [91, 100]]
    assert all(points[w]["all"] == 0.5 for w in points)
    assert points["first"]["by_type"]["kind"] == pytest.approx(sum(n for n in range(1, 11) if n % 3) / 7 / 100)
    assert points["last"]["right"] == {"all": None, "by_type": {"kind": 0.5}}
    summary = {"monitor": {0: {"grpo": points}}}
    assert "| 0 | grpo | `kind` | 5.3 (right 50.0; steps 1-10) |" in "\n".join(monitor_lines(summary))
    assert "| 0 | grpo | all | 50.0 (steps 1-10) | 50.0 (steps 46-55) |" in "\n".join(monitor_lines(summary))
    short = exp.stage_dir("grpo", 1)
    short.mkdir(parents=True)
    (short / "metrics.jsonl").write_text(json.dumps({"step": 1, "guards/answer_share": 0.5}) + "\n")
    assert monitor(exp, 1)["grpo"]["last"] == {"steps": [1, 1], "all": 0.5, "by_type": {},
                                               "right": {"all": None, "by_type": {}}}


def test_a_report_without_blanked_answers_has_no_image_dependent_accuracy(tmp_path):
    exp = Experiment(source="x.yaml", name="x", output_dir=tmp_path, base_seed=0, compose={}, stages={},
                     eval={"splits": ["val"]})
    plain = [{**r, "blank_correct": None} for r in rows([1, 0], [0, 0], ["a", "b"], ["a", "a"], ["t", "t"])]
    table = split_table(exp, [0], "val", {(0, m): plain for m in ("base", "sft", "grpo")})
    assert table["models"]["grpo"]["all"]["image_dependent"] is None and table["verdict"] is None
    assert table["models"]["grpo"]["all"]["accuracy"]["across_seeds"] is None  # one seed: no t-interval


@pytest.mark.parametrize("name", ["smollm2-learns-to-see", "smollm2-same-skill"])
def test_the_committed_results_recompute_from_their_reports(name):
    """docs/results/<name>: summary.json's tables are what split_table makes of the committed per-question reports
    (reports/seedN/), so the page's figures can be checked without the runs."""
    from pathlib import Path

    from vlm_grpo.experiment.plan import read_experiment

    results = Path(__file__).resolve().parents[2] / "docs" / "results" / name
    summary = json.loads((results / "summary.json").read_text())
    exp = read_experiment(Path(__file__).resolve().parents[2] / summary["config"])
    seeds = summary["seeds"]
    assert summary["splits"]
    for split, committed in summary["splits"].items():
        rows = {(seed, model): json.loads((results / "reports" / f"seed{seed}" / f"{model}-{split}.json").read_text())
                for seed in seeds for model in exp.models()}
        assert json.loads(json.dumps(split_table(exp, seeds, split, rows))) == committed, split
