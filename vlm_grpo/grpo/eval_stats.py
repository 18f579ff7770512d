"""The statistics of an evaluation's accuracy: its standard error, a 95% interval, and the paired difference of two
evaluations of the same samples (two models answering the same held-out images)."""

from __future__ import annotations

import math
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def binomial_se(hits: int, n: int) -> float:
    """The standard error of an accuracy of `hits` out of `n`: sqrt(p(1 - p) / n)."""
    if n < 1:
        raise ValueError("an accuracy needs at least one sample")
    p = hits / n
    return math.sqrt(p * (1 - p) / n)


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of an accuracy (stays inside [0, 1] and is not empty at 0% or 100%)."""
    if n < 1:
        raise ValueError("an accuracy needs at least one sample")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at 0% and 100% the bound is exactly 0 or 1 (rounding would leave the accuracy just outside)
    low = 0.0 if hits == 0 else max(0.0, centre - half)
    high = 1.0 if hits == n else min(1.0, centre + half)
    return low, high


def accuracy_stats(correct: list[bool]) -> dict[str, Any]:
    hits, n = sum(map(bool, correct)), len(correct)
    low, high = wilson_interval(hits, n)
    return {"accuracy": hits / n, "accuracy_se": binomial_se(hits, n), "accuracy_ci95": [low, high]}


def paired_difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`after`'s accuracy minus `before`'s on the samples both answered (matched by index), with the standard error
    of the mean paired difference (sd of the per-sample differences / sqrt(n)) and its 95% normal interval. Pairing
    removes the samples' own difficulty from the error: the same images answered by two models."""
    first = {r["index"]: bool(r["correct"]) for r in before["samples"] if r.get("correct") is not None}
    second = {r["index"]: bool(r["correct"]) for r in after["samples"] if r.get("correct") is not None}
    shared = sorted(first.keys() & second.keys())
    if len(shared) < 2:
        raise ValueError(f"a paired difference needs at least two samples both reports answered; {len(shared)} are shared")
    diffs = [int(second[i]) - int(first[i]) for i in shared]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    return {"n": n, "difference": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se],
            "z": mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean)),
            "gained": sum(d > 0 for d in diffs), "lost": sum(d < 0 for d in diffs)}
