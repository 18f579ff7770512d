"""The experiment's table across seeds (summary.md, summary.json, and a compact copy of every report: small files
to commit beside the page that quotes them).

For each split (validation: eval.splits; test: eval.test_splits, once asked) and question type (and all together),
for every model (the aligned base, SFT, GRPO, each arm): accuracy, image-dependent accuracy (accuracy minus the
accuracy with each image blanked, question by question), the constant-answer baseline (always the commonest right
answer) and the share of the model's commonest answer; then each GRPO model (grpo and the GRPO variants) minus every
control (SFT and the arms that are not GRPO variants) on both, with the SE clustered by question and a t-interval
across seeds (stats.py), and whether it beats the best control by more than 2 SE. Also: the answer marginal each
GRPO run logged while it trained, stage times, versions, and a few answers GRPO changed.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.grpo import safe_files
from vlm_grpo.experiment.stages import done, eval_task, model_stage, report_path
from vlm_grpo.experiment.stats import beats, clustered_mean, commonest, difference
from vlm_grpo.markdown_text import code_span

ALL = "all"  # every question type together; each type's own figures sit apart, under "by_type", so that a recipe
# whose question type is itself called "all" (or "steps") cannot overwrite the total
MONITOR = "guards/answer_share"  # the answer marginal the GRPO runs log (grpo/guards/hacking_watch.py)
RIGHT = "guards/right_answer_share"  # beside it: the commonest right answer's share among the same prompts


def seeds_found(exp: Experiment, splits: list[str]) -> list[int]:
    found = [int(m.group(1)) for p in exp.output_dir.glob("seed*") if (m := re.fullmatch(r"seed(\d+)", p.name))]
    return sorted(s for s in found if all(report_path(exp, model, split, s).is_file() for model in exp.models()
                                          for split in splits))


def grpo_models(exp: Experiment) -> list[str]:
    return ["grpo", *(name for name, arm in exp.arms.items() if arm["method"] == "grpo")]


def control_models(exp: Experiment) -> list[str]:
    """What GRPO is measured against: the SFT model it starts from and every arm that is not a GRPO variant."""
    return ["sft", *(name for name, arm in exp.arms.items() if arm["method"] != "grpo")]


def compact(report: dict[str, Any], span) -> list[dict[str, Any]]:
    """A report's questions, one small row each: what the table is computed from (and committed)."""
    from vlm_grpo.grpo.guards.hacking_watch import plain  # stated as the answer-marginal monitor states it (torch: here)

    return [{"index": r["index"], "type": r.get("question_type"), "answer": r.get("answer"),
             "stated": plain(span(r["completion"])), "correct": bool(r["correct"]),
             "blank_correct": r.get("blank_correct")} for r in report["samples"] if r.get("correct") is not None]


def of_kind(rows: list[dict[str, Any]], kind: str | None) -> list[dict[str, Any]]:
    """The rows of question type `kind`; every row for None (the total)."""
    return rows if kind is None else [r for r in rows if r["type"] == kind]


def per_kind(kinds: list[str], figure) -> dict[str, Any]:
    """`figure(kind)` for all questions together and for each question type: {"all": ..., "by_type": {kind: ...}}."""
    return {ALL: figure(None), "by_type": {kind: figure(kind) for kind in kinds}}


def values(rows: list[dict[str, Any]], kind: str | None, what: str) -> dict[int, float] | None:
    """Question index -> the value `what` (accuracy, image_dependent) over the rows of question type `kind` (None:
    every row); None when a row lacks it (a report without blanked answers has no image-dependent accuracy)."""
    rows = of_kind(rows, kind)
    if what == "accuracy":
        return {r["index"]: float(r["correct"]) for r in rows}
    if any(r["blank_correct"] is None for r in rows):
        return None
    return {r["index"]: float(r["correct"]) - float(r["blank_correct"]) for r in rows}


def split_table(exp: Experiment, seeds: list[int], split: str, rows: dict[tuple[int, str], list]) -> dict[str, Any]:
    """One split: per model and question type the statistics, the constant-answer baseline, the comparisons."""
    first = rows[(seeds[0], "sft")]
    kinds = sorted({r["type"] for r in first if r["type"] is not None})
    baseline = per_kind(kinds, lambda kind: commonest([r["answer"] for r in of_kind(first, kind) if r["answer"] is not None]))

    def figures(model: str, kind: str | None) -> dict[str, Any]:
        acc = [values(rows[(s, model)], kind, "accuracy") for s in seeds]
        dep = [values(rows[(s, model)], kind, "image_dependent") for s in seeds]
        return {"accuracy": clustered_mean(acc), "image_dependent": None if None in dep else clustered_mean(dep),
                "commonest_answer": [commonest([r["stated"] for r in of_kind(rows[(s, model)], kind)]) for s in seeds]}

    models = {model: per_kind(kinds, lambda kind, model=model: figures(model, kind)) for model in exp.models()}
    comparisons: dict[str, Any] = {}
    for grpo in grpo_models(exp):
        for other in control_models(exp):
            comparisons[f"{grpo} - {other}"] = per_kind(kinds, lambda kind, grpo=grpo, other=other: {
                what: _diff(rows, seeds, grpo, other, kind, what) for what in ("accuracy", "image_dependent")})
    return {"role": "test" if split in exp.eval.get("test_splits", []) else "validation", "kinds": kinds,
            "baseline": baseline, "models": models, "comparisons": comparisons, "verdict": verdict(exp, models, comparisons)}


def _diff(rows, seeds, first: str, second: str, kind: str | None, what: str):
    a = [values(rows[(s, first)], kind, what) for s in seeds]
    b = [values(rows[(s, second)], kind, what) for s in seeds]
    return None if None in a or None in b else difference(a, b)


def verdict(exp: Experiment, models: dict[str, Any], comparisons: dict[str, Any]) -> dict[str, Any] | None:
    """Each GRPO model against the best control on image-dependent accuracy over all questions: the control with the
    highest mean, and whether the GRPO model beats it by more than 2 clustered SEs."""
    scored = {m: models[m][ALL]["image_dependent"] for m in control_models(exp)}
    if any(v is None for v in scored.values()):
        return None
    best = max(scored, key=lambda m: scored[m]["mean"])
    return {"best_control": best, "image_dependent": scored[best]["mean"],
            "grpo": {g: {"difference": comparisons[f"{g} - {best}"][ALL]["image_dependent"],
                         "beats_by_2_se": beats(comparisons[f"{g} - {best}"][ALL]["image_dependent"])}
                     for g in grpo_models(exp)}}


WINDOW = 10  # steps averaged per monitor point: one step asks a handful of prompts, so its share alone is noise


def monitor(exp: Experiment, seed: int) -> dict[str, Any]:
    """Each GRPO run's answer marginal (metrics.jsonl's guards/answer_share keys), averaged over its first, middle and
    last WINDOW steps (fewer when the run is short): one step's share is of a handful of prompts, and says more about
    which answers they happen to need than about a drift."""
    out = {}
    for stage in grpo_models(exp):
        path = exp.stage_dir(stage, seed) / "metrics.jsonl"
        if not path.is_file():
            continue
        steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [s for s in steps if any(k.startswith(MONITOR) for k in s)]
        if steps:
            out[stage] = windowed(steps)
    return out


def windowed(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer shares of `steps` (metrics rows, in order) over the first, middle and last WINDOW of them."""
    size = max(1, min(WINDOW, len(steps) // 3))
    middle = (len(steps) - size) // 2
    windows = {"first": steps[:size], "middle": steps[middle:middle + size], "last": steps[-size:]}
    return {when: window_shares(part) for when, part in windows.items()}


def window_shares(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each answer-share key over `steps` (over the steps that logged it), which steps they were, and
    the same for the share the commonest right answer held among those prompts (logged beside it: RIGHT)."""
    def shares(prefix: str) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            logged = [s[key] for s in steps if s.get(key) is not None]
            return sum(logged) / len(logged) if logged else None

        kinds = sorted({k[len(prefix) + 1:] for s in steps for k in s if k.startswith(prefix + "/")})
        return {ALL: mean(prefix), "by_type": {kind: mean(f"{prefix}/{kind}") for kind in kinds}}

    return {"steps": [steps[0].get("step"), steps[-1].get("step")], **shares(MONITOR), "right": shares(RIGHT)}


def versions() -> dict[str, str]:
    """What produced the table: the package versions and the source's commit (when it is a git checkout)."""
    from importlib import metadata

    import torch
    import transformers

    try:
        own = metadata.version("vlm-grpo")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        own = "unknown"
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "vlm_grpo": own}
    try:
        root = Path(__file__).resolve().parents[2]
        out["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        out["commit"] = "unknown"
    return out


def summarize_experiment(exp: Experiment) -> dict[str, Any]:
    from vlm_grpo.grpo.guards.hacking_watch import run_hints
    from vlm_grpo.recipes import get_recipe

    validation = list(exp.eval.get("splits", ["test"]))
    seeds = seeds_found(exp, validation)
    if not seeds:
        raise RuntimeError(f"no seed of {exp.name} has all its reports in {exp.output_dir}; run `vlm-grpo experiment "
                           f"{exp.source} --seed N` first")
    tests = [s for s in exp.eval.get("test_splits", []) if seeds_found(exp, [s]) == seeds]
    span = run_hints(get_recipe(eval_task(exp)["recipe"]), custom_rewards=False).span
    tables, kept = {}, exp.output_dir / "reports"
    for split in validation + tests:
        rows = {}
        for seed in seeds:
            for model in exp.models():
                rows[(seed, model)] = compact(json.loads(report_path(exp, model, split, seed).read_text()), span)
                out = kept / f"seed{seed}" / f"{model}-{split}.json"
                safe_files.write_below(exp.output_dir, out, json.dumps(rows[(seed, model)], separators=(",", ":")) + "\n")
        tables[split] = split_table(exp, seeds, split, rows)
    times = {seed: {stage: (done(exp.stage_dir(stage, seed)) or {}).get("seconds")
                    for stage in exp.stage_names() if stage != "eval"} for seed in seeds}
    for seed in seeds:
        times[seed]["eval"] = (done(exp.seed_dir(seed) / "eval") or {}).get("seconds")
    summary = {"experiment": exp.name, "config": exp.source, "written": datetime.date.today().isoformat(),
               "versions": versions(), "seeds": seeds, "independent_seeds": exp.independent_seeds,
               "arms": exp.arms, "splits": tables, "times": times,
               "monitor": {seed: monitor(exp, seed) for seed in seeds},
               "changed": changed_answers(exp, seeds[0], validation[0], int(exp.eval.get("samples", 4)))}
    safe_files.write_below(exp.output_dir, exp.output_dir / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    safe_files.write_below(exp.output_dir, exp.output_dir / "summary.md", markdown(summary))
    return summary


def changed_answers(exp: Experiment, seed: int, split: str, limit: int) -> list[dict[str, Any]]:
    """Questions whose answer GRPO changed from SFT's (one seed, one split), those it made right first."""
    sft, grpo = (json.loads(report_path(exp, m, split, seed).read_text())["samples"] for m in ("sft", "grpo"))
    later = {r["index"]: r for r in grpo}
    pairs = [(r, later[r["index"]]) for r in sft if r["index"] in later and r["correct"] != later[r["index"]]["correct"]]
    pairs.sort(key=lambda pair: not pair[1]["correct"])
    return [{"seed": seed, "split": split, "index": a["index"], "prompt": a["prompt"], "sft": a["completion"],
             "sft_correct": a["correct"], "grpo": b["completion"], "grpo_correct": b["correct"]} for a, b in pairs[:limit]]


# ------------------------------------------------------------------------------------------------ markdown


def points(value: float, signed: bool = False) -> str:
    """A fraction in points, one decimal; a value that rounds to zero prints as 0.0, never -0.0."""
    rounded = round(100 * value, 1) + 0.0  # adding 0.0 turns -0.0 into 0.0
    return f"{rounded:+.1f}" if signed else f"{rounded:.1f}"


def pct(value: float | None) -> str:
    return "-" if value is None else points(value)


def stat(s: dict[str, Any] | None, signed: bool = False) -> str:
    """mean +/- clustered SE, in points."""
    if s is None:
        return "-"
    mean = points(s["mean"], signed)
    return mean + ("" if s["se_clustered"] is None else f" +/- {pct(s['se_clustered'])}")


def across(s: dict[str, Any] | None) -> str:
    if s is None or s["across_seeds"] is None:
        return "-"
    a = s["across_seeds"]
    return f"[{points(a['ci95'][0], True)}, {points(a['ci95'][1], True)}] (df {a['df']})"


def leaning(stated: list[dict[str, Any] | None]) -> str:
    return ", ".join("-" if c is None else f"{code_span(c['answer'], cell=True)} {pct(c['share'])}" for c in stated)


def markdown(summary: dict[str, Any]) -> str:
    v = summary["versions"]
    seeds = summary["seeds"]
    lines = [f"# {summary['experiment']}", "",
             f"Written {summary['written']} by `vlm-grpo experiment {summary['config']} --stages none --summary` "
             f"(commit {v['commit']}; torch {v['torch']}, transformers {v['transformers']}). Seeds {seeds}; "
             + ("each seed composed and aligned its own tower and projector." if summary["independent_seeds"] else
                "the seeds share the composed and aligned model (tower and projector) of one base seed."),
             "",
             "Accuracy and image-dependent accuracy (accuracy minus accuracy with each image blanked) in %, mean over "
             "seeds +/- SE clustered by question (the seeds answer the same questions); the seeds' t-interval: the 95% "
             "interval of the mean from the seeds' own means (df = seeds - 1). Constant: always answering the "
             "commonest right answer. Leaning: each seed's commonest answer and its share.", ""]
    for split, table in summary["splits"].items():
        lines += [f"## {split} ({table['role']})", ""]
        verdict = table["verdict"]
        if verdict:
            for grpo, result in verdict["grpo"].items():
                d = result["difference"]
                lines.append(f"**{grpo} - {verdict['best_control']} (the best control), image-dependent accuracy: "
                             f"{stat(d, signed=True)}; seeds' t-interval {across(d)}: "
                             f"{'beats it by more than 2 SE' if result['beats_by_2_se'] else 'does not beat it by 2 SE'}.**")
            lines.append("")
        lines += ["| model | question type | n | accuracy | image-dependent | constant | leaning (per seed) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for model, figures in table["models"].items():
            for kind, s, base in each_kind(table["kinds"], figures, table["baseline"]):
                n = "-" if s["accuracy"] is None else s["accuracy"]["questions"]
                constant = "-" if base is None else f"{pct(base['share'])} ({code_span(base['answer'], cell=True)})"
                lines.append(f"| {model} | {kind_cell(kind)} | {n} | {stat(s['accuracy'])} | {stat(s['image_dependent'])} | "
                             f"{constant} | {leaning(s['commonest_answer'])} |")
        lines += ["", "| difference | question type | accuracy | seeds' t-interval | image-dependent | seeds' t-interval |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, figures in table["comparisons"].items():
            for kind, c in each_kind(table["kinds"], figures):
                lines.append(f"| {name} | {kind_cell(kind)} | {stat(c['accuracy'], True)} | {across(c['accuracy'])} | "
                             f"{stat(c['image_dependent'], True)} | {across(c['image_dependent'])} |")
        lines.append("")
    lines += monitor_lines(summary)
    stages = list(next(iter(summary["times"].values())))
    lines += ["## Stage times (seconds)", "", "| seed | " + " | ".join(stages) + " |", "| --- " * (len(stages) + 1) + "|"]
    for seed, t in summary["times"].items():
        lines.append(f"| {seed} | " + " | ".join("-" if t[s] is None else f"{t[s]:.0f}" for s in stages) + " |")
    lines += ["", "## Answers GRPO changed", ""]
    for s in summary["changed"]:
        lines += [f"- seed {s['seed']}, {s['split']} #{s['index']}: {code_span(s['prompt'])}",
                  f"  - after SFT ({'right' if s['sft_correct'] else 'wrong'}): {code_span(s['sft'])}",
                  f"  - after GRPO ({'right' if s['grpo_correct'] else 'wrong'}): {code_span(s['grpo'])}"]
    return "\n".join(lines) + "\n"


def monitor_lines(summary: dict[str, Any]) -> list[str]:
    rows = []
    for seed, stages in summary["monitor"].items():
        for stage, points in stages.items():
            kinds = sorted({k for p in points.values() for k in p["by_type"]})
            windows = list(points.values())
            for (kind, *stated), (_, *right) in zip(each_kind(kinds, *windows),
                                                    each_kind(kinds, *(w.get("right", EMPTY) for w in windows))):
                rows.append(f"| {seed} | {stage} | {kind_cell(kind)} | " + " | ".join(
                    share_cell(*cell) for cell in zip(stated, right, windows)) + " |")
    if not rows:
        return []
    return ["## Answer marginal while GRPO trained", "",
            "The share of the commonest stated answer among each step's sampled completions (metrics.jsonl "
            f"guards/answer_share), per question type, averaged over the first, middle and last {WINDOW} steps. A step "
            "asks a handful of prompts, whose own right answers may be mostly one: \"right\", where the run logged it "
            "(guards/right_answer_share), is the share the commonest right answer held among the same prompts, what a "
            "policy right on every prompt would show. A share above it is a lean to one answer.", "",
            "| seed | run | question type | first | middle | last |", "| --- | --- | --- | --- | --- | --- |", *rows, ""]


EMPTY: dict[str, Any] = {ALL: None, "by_type": {}}  # a window of a run that did not log the right-answer share


def share_cell(stated: float | None, right: float | None, window: dict[str, Any]) -> str:
    first, last = window["steps"]
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return f"{pct(stated)} ({steps})" if right is None else f"{pct(stated)} (right {pct(right)}; {steps})"


def each_kind(kinds: list[str], *tables: dict[str, Any]):
    """(kind, each table's figure) for the total (kind None) and then each question type; a type a table lacks: None."""
    yield (None, *(t[ALL] for t in tables))
    for kind in kinds:
        yield (kind, *(t["by_type"].get(kind) for t in tables))


def kind_cell(kind: str | None) -> str:
    """A question type in a table cell: the recipe's (from its samples), so shown as text; None is the total, "all"."""
    return ALL if kind is None else code_span(kind, cell=True)

