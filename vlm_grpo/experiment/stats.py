"""The statistics of an experiment's table, over seeds that answer the same questions.

The seeds share the evaluation's questions, so their answers are not independent draws: a question hard for one
seed is hard for the others. A mean over seeds and questions gets its standard error clustered by question (the
per-question means over seeds, their SD over sqrt(questions): CR1 with one cluster per question), and beside it the
spread of the seeds' own means as a t-interval with seeds - 1 degrees of freedom, which sees what the questions do
not: everything a seed shares across its answers (its tower, projector, SFT and GRPO runs).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any, Sequence

# Student's t, 97.5% quantile, by degrees of freedom 1..30 (a 95% two-sided interval); above 30 the normal's plus
# the first two terms of its Cornish-Fisher expansion, within 0.001 of the exact value
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959963984540054


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t-interval needs at least 1 degree of freedom (2 seeds), got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def clustered_mean(by_seed: Sequence[dict[int, float]]) -> dict[str, Any] | None:
    """The mean of a per-question value over seeds and the questions every seed answered (`by_seed`: per seed,
    question index -> value), its SE clustered by question, and the seeds' own means with a t-interval across them.
    None when no question is shared."""
    if not by_seed:
        return None
    shared = sorted(set.intersection(*(set(values) for values in by_seed)))
    if not shared:
        return None
    per_question = [statistics.fmean(values[i] for values in by_seed) for i in shared]
    n, k = len(shared), len(by_seed)
    mean = statistics.fmean(per_question)
    se = statistics.stdev(per_question) / math.sqrt(n) if n > 1 else None
    per_seed = [statistics.fmean(values[i] for i in shared) for values in by_seed]
    out: dict[str, Any] = {"mean": mean, "questions": n, "seeds": k, "se_clustered": se,
                           "z": None if not se else mean / se, "per_seed": per_seed, "across_seeds": None}
    if k > 1:
        sd = statistics.stdev(per_seed)
        half = t_quantile(k - 1) * sd / math.sqrt(k)
        out["across_seeds"] = {"se": sd / math.sqrt(k), "df": k - 1, "ci95": [mean - half, mean + half],
                               "t": mean / (sd / math.sqrt(k)) if sd > 0 else None}
    return out


def difference(first: Sequence[dict[int, float]], second: Sequence[dict[int, float]]) -> dict[str, Any] | None:
    """`first` minus `second`, question by question within each seed (the same questions, the same seed's base),
    as clustered_mean: the paired difference's SE clustered by question and its t-interval across seeds."""
    if len(first) != len(second):
        raise ValueError(f"a paired difference needs the same seeds on both sides ({len(first)} and {len(second)})")
    return clustered_mean([{i: a[i] - b[i] for i in a.keys() & b.keys()} for a, b in zip(first, second)])


def commonest(values: Sequence[str]) -> dict[str, Any] | None:
    """The commonest value and its share: of the right answers, the constant-answer baseline (always saying it
    scores that share); of a model's answers, how far it leans on one answer."""
    if not values:
        return None
    value, count = Counter(values).most_common(1)[0]
    return {"answer": value, "share": count / len(values), "n": len(values)}


def beats(diff: dict[str, Any] | None, margin: float = 2.0) -> bool:
    """Whether a difference is above `margin` clustered SEs."""
    return bool(diff and diff["se_clustered"] and diff["mean"] > margin * diff["se_clustered"])
