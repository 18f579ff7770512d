"""The experiment's results across seeds: accuracy with its standard error and 95% interval for each model and
split, image reliance, GRPO minus SFT as a paired difference (same images) with its standard error, stage times,
and a few answers of the same held-out images after SFT and after GRPO. Written as summary.md and summary.json."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.experiment.stages import EVALUATED, done, report_path
from vlm_grpo.grpo.eval_stats import Z95, paired_difference


def seeds_found(exp: Experiment) -> list[int]:
    found = [int(m.group(1)) for p in exp.output_dir.glob("seed*") if (m := re.fullmatch(r"seed(\d+)", p.name))]
    return sorted(s for s in found if all(report_path(exp, model, split, s).is_file() for model in EVALUATED
                                          for split in exp.eval.get("splits", ["test"])))


def seed_result(exp: Experiment, seed: int) -> dict[str, Any]:
    splits = exp.eval.get("splits", ["test"])
    reports = {(m, s): json.loads(report_path(exp, m, s, seed).read_text()) for m in EVALUATED for s in splits}
    times = {stage: (done(exp.stage_dir(stage, seed)) or {}).get("seconds") for stage in ("compose", "align", "sft", "grpo")}
    times["eval"] = (done(exp.seed_dir(seed) / "eval") or {}).get("seconds")
    out: dict[str, Any] = {"seed": seed, "seconds": times, "splits": {}}
    for split in splits:
        row = {}
        for model in EVALUATED:
            r = reports[(model, split)]
            row[model] = {"accuracy": r["accuracy"], "se": r["accuracy_se"], "ci95": r["accuracy_ci95"],
                          "n": r["size"], "format": r["rewards"].get("format"),
                          "image_reliance": r.get("image_reliance"), "by_question_type": r.get("by_question_type") or {}}
        row["grpo_minus_sft"] = paired_difference(reports[("sft", split)], reports[("grpo", split)])
        row["samples"] = _samples(reports[("sft", split)], reports[("grpo", split)], int(exp.eval.get("samples", 4)))
        out["splits"][split] = row
    return out


def _samples(sft: dict[str, Any], grpo: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Held-out images whose answer GRPO changed, those it made right first."""
    later = {r["index"]: r for r in grpo["samples"]}
    changed = [(r, later[r["index"]]) for r in sft["samples"] if r["index"] in later and r["correct"] != later[r["index"]]["correct"]]
    changed.sort(key=lambda pair: not pair[1]["correct"])
    return [{"index": a["index"], "prompt": a["prompt"], "sft": a["completion"], "sft_correct": a["correct"],
             "grpo": b["completion"], "grpo_correct": b["correct"]} for a, b in changed[:limit]]


def se_across(values: list[float]) -> float | None:
    """The standard error of the seeds' mean (sample SD / sqrt k); None for a single seed."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def pooled(results: list[dict[str, Any]], split: str) -> dict[str, Any]:
    """Over seeds: each model's mean accuracy with the standard error across seeds, and the mean paired GRPO - SFT
    difference with two standard errors: the seeds' paired errors combined (sqrt(sum se^2) / k) and the spread of
    the seeds' differences (sd / sqrt k)."""
    k = len(results)
    out: dict[str, Any] = {"seeds": k}
    for model in EVALUATED:
        values = [r["splits"][split][model]["accuracy"] for r in results]
        out[model] = {"accuracy": statistics.fmean(values), "se_across_seeds": se_across(values)}
    diffs = [r["splits"][split]["grpo_minus_sft"]["difference"] for r in results]
    mean = statistics.fmean(diffs)
    se = math.sqrt(sum(r["splits"][split]["grpo_minus_sft"]["se"] ** 2 for r in results)) / k
    # the seeds' own spread: what another seed would give, which the paired errors (same images) do not see
    spread = se_across(diffs)
    out["grpo_minus_sft"] = {"difference": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se],
                             "z": mean / se if se > 0 else 0.0, "se_across_seeds": spread,
                             "z_across_seeds": mean / spread if spread else None}
    return out


def summarize_experiment(exp: Experiment) -> dict[str, Any]:
    seeds = seeds_found(exp)
    if not seeds:
        raise RuntimeError(f"no seed of {exp.name} has all its reports in {exp.output_dir}; run `vlm-grpo experiment "
                           f"{exp.source} --seed N` first")
    results = [seed_result(exp, s) for s in seeds]
    summary = {"experiment": exp.name, "seeds": results,
               "pooled": {split: pooled(results, split) for split in exp.eval.get("splits", ["test"])}}
    (exp.output_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (exp.output_dir / "summary.md").write_text(markdown(summary))
    return summary


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# {summary['experiment']}", "",
             "Accuracy in % +/- its standard error [95% Wilson interval]; image reliance: accuracy with the image "
             "blanked; GRPO - SFT: paired difference on the same images +/- its standard error (z = difference / SE).", ""]
    for split, pool in summary["pooled"].items():
        lines += [f"## {split}", "", "| seed | base | after SFT | after GRPO | blanked (base / SFT / GRPO) | GRPO - SFT | z |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for result in summary["seeds"]:
            row = result["splits"][split]
            cells = [f"{pct(row[m]['accuracy'])} +/- {pct(row[m]['se'])} [{pct(row[m]['ci95'][0])}, {pct(row[m]['ci95'][1])}]"
                     for m in EVALUATED]
            blank = " / ".join(pct(row[m]["image_reliance"]["blank_accuracy"]) if row[m]["image_reliance"] else "-"
                               for m in EVALUATED)
            d = row["grpo_minus_sft"]
            lines.append(f"| {result['seed']} | " + " | ".join(cells) +
                         f" | {blank} | {100 * d['difference']:+.1f} +/- {pct(d['se'])} | {d['z']:.1f} |")
        d = pool["grpo_minus_sft"]
        means = " | ".join(pct(pool[m]["accuracy"]) + (f" +/- {pct(pool[m]['se_across_seeds'])}" if pool[m]["se_across_seeds"] is not None else "")
                           for m in EVALUATED)
        lines += [f"| mean of {pool['seeds']} | {means} | | {100 * d['difference']:+.1f} +/- {pct(d['se'])} | {d['z']:.1f} |", ""]
        if d["se_across_seeds"] is not None:
            z = "-" if d["z_across_seeds"] is None else f"{d['z_across_seeds']:.1f}"
            lines += [f"GRPO - SFT across the seeds: {100 * d['difference']:+.1f} +/- {pct(d['se_across_seeds'])} "
                      f"(z = {z}), the SE of the {pool['seeds']} seeds' differences; the +/- above combines their "
                      "paired SEs (the images' sampling error only).", ""]
    lines += by_type_lines(summary)
    lines += ["## Stage times (seconds)", "", "| seed | compose | align | sft | grpo | eval |", "| --- | --- | --- | --- | --- | --- |"]
    for result in summary["seeds"]:
        t = result["seconds"]
        lines.append(f"| {result['seed']} | " + " | ".join("-" if t[s] is None else f"{t[s]:.0f}" for s in ("compose", "align", "sft", "grpo", "eval")) + " |")
    lines += ["", "compose and align run once (shared by the seeds).", "", "## Answers GRPO changed (first seed)", ""]
    first = summary["seeds"][0]
    for split in summary["pooled"]:
        for s in first["splits"][split]["samples"]:
            lines += [f"- {split} #{s['index']}: {s['prompt']}",
                      f"  - after SFT ({'right' if s['sft_correct'] else 'wrong'}): `{_one_line(s['sft'])}`",
                      f"  - after GRPO ({'right' if s['grpo_correct'] else 'wrong'}): `{_one_line(s['grpo'])}`"]
    return "\n".join(lines) + "\n"


def by_type_lines(summary: dict[str, Any]) -> list[str]:
    """Accuracy on each kind of question, where the recipe names them: what SFT left to GRPO shows here."""
    lines = []
    for split in summary["pooled"]:
        rows = []
        for result in summary["seeds"]:
            by_model = [result["splits"][split][m]["by_question_type"] for m in EVALUATED]
            for kind in sorted({k for types in by_model for k in types}):  # an older report without types has none
                cells = [types.get(kind) for types in by_model]
                n = next(c["n"] for c in cells if c is not None)
                rows.append(f"| {result['seed']} | {kind} | {n} | " + " | ".join(
                    "-" if c is None else f"{pct(c['accuracy'])} +/- {pct(c['accuracy_se'])}" for c in cells) + " |")
        if rows:
            lines += [f"## {split}: accuracy by question type", "", "| seed | question type | n | base | after SFT | after GRPO |",
                      "| --- | --- | --- | --- | --- | --- |", *rows, ""]
    return lines


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n").replace("`", "'")
