"""A run's curves as small inline SVG, for report.html: a few milliseconds and kilobytes per chart (matplotlib takes
a quarter of a second per chart, which every train command would pay for its report), no script, nothing to load.
Raw values are points, the trend a smoothed line (inspect/plots.py's `smooth`), as in the PNG charts."""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

from vlm_grpo.inspect.plots import PALETTE, RunData, accuracy_per_step, smooth

WIDTH, HEIGHT = 340, 210
LEFT, RIGHT, TOP, BOTTOM = 56, 10, 26, 34


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    span = hi - lo
    raw = span / n
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def _limits(values: np.ndarray) -> tuple[float, float]:
    lo, hi = float(values.min()), float(values.max())
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 0.5
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def _label(v: float, log: bool = False) -> str:
    return f"{v:.2g}" if log else f"{v:.3g}"


def line_chart(name: str, title: str, series: Sequence[tuple[str, np.ndarray, np.ndarray]], ylabel: str = "",
               log: bool = False) -> str:
    """One chart: `series` as (label, steps, values); `log` draws log10 of the positive values on the y axis."""
    drawn = []
    for label, x, y in series:
        x, y = np.asarray(x, float), np.asarray(y, float)
        if log:
            keep = y > 0
            x, y = x[keep], np.log10(y[keep])
        if len(x):
            drawn.append((label, x, y))
    all_x = np.concatenate([x for _, x, _ in drawn]) if drawn else np.zeros(1)
    all_y = np.concatenate([y for _, _, y in drawn]) if drawn else np.zeros(1)
    x0, x1 = (float(all_x.min()) - 0.5, float(all_x.max()) + 0.5) if np.ptp(all_x) == 0 else (all_x.min(), all_x.max())
    y0, y1 = _limits(all_y)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v):
        return LEFT + (v - x0) / (x1 - x0) * pw

    def py(v):
        return TOP + (1 - (v - y0) / (y1 - y0)) * ph

    out = [f'<svg class="chart-svg" data-chart="{html.escape(name)}" xmlns="http://www.w3.org/2000/svg" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="10">',
           f'<text x="{WIDTH / 2}" y="14" text-anchor="middle" font-weight="bold" font-size="11">{html.escape(title)}</text>']
    for t in nice_ticks(y0, y1):
        y = py(t)
        out.append(f'<path class="grid" d="M{LEFT} {y:.1f}H{LEFT + pw}" stroke="#e3e3e3"/>'
                   f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_label(10 ** t if log else t, log)}</text>')
    xticks = [t for t in nice_ticks(x0, x1) if abs(t - round(t)) < 1e-9] or [x0]
    for t in xticks:
        x = px(t)
        out.append(f'<path class="grid" d="M{x:.1f} {TOP}V{TOP + ph}" stroke="#eeeeee"/>'
                   f'<text x="{x:.1f}" y="{TOP + ph + 13}" text-anchor="middle">{_label(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>'
               f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 4}" text-anchor="middle">step</text>'
               f'<text transform="translate(11 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(ylabel + (" (log)" if log else ""))}</text>')
    for k, ((label, x, y), color) in enumerate(zip(drawn, PALETTE)):
        if len(x) <= 300:
            out += [f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="2" fill="{color}" fill-opacity="0.4"/>'
                    for a, b in zip(x, y)]
        trend = smooth(y)
        d = "M" + "L".join(f"{px(a):.1f} {py(b):.1f}" for a, b in zip(x, trend))
        out.append(f'<path class="series" d="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        if len(drawn) > 1:
            out.append(f'<text x="{LEFT + pw - 4}" y="{TOP + 12 + 11 * k}" text-anchor="end" fill="{color}">'
                       f"{html.escape(label)}</text>")
    out.append("</svg>")
    return "".join(out)


# The report's curves: (name, title, [(metric, label)], y label, log scale); charts whose metrics were never logged
# are left out. The same metrics as `vlm-grpo plot`'s charts, drawn by svg_charts.py.
CURVES = (
    ("reward", "Reward (total)", [("reward", "reward")], "mean reward", False),
    ("reward_components", "Reward components", None, "mean reward", False),  # None: every rewards/<name>
    ("kl", "KL to reference", [("kl", "kl")], "KL", True),
    ("completion_length", "Completion length", [("completion_length", "length")], "tokens", False),
    ("heldout_accuracy", "Held-out accuracy (greedy)", [("eval/accuracy", "held-out")], "accuracy", False),
    ("image_reliance", "Image reliance (log-prob with - without the image)",
     [("grounding/image_reliance", "vs a blank image"), ("grounding/image_reliance_swap", "vs another image")],
     "nats / token", False),
    ("attention_to_image", "Attention of answer tokens to the image", [("grounding/attention_to_image", "share")],
     "share", False),
    ("hacking_signs", "Signs of reward hacking",
     [("guards/identical_groups", "identical groups"), ("guards/enumeration", "answers listed"),
      ("guards/at_length_limit", "at the length limit")], "share of completions", False),
    ("guard_trips", "Guard trips (cumulative steps)", "guards/trips/", "steps", False),  # a prefix: every such metric
    ("entropy", "Policy entropy", [("entropy", "entropy")], "nats / token", False),
    ("clip_fraction", "Clip fraction", [("clip_ratio/region_mean", "any"), ("clip_ratio/low_mean", "low"),
                                        ("clip_ratio/high_mean", "high")], "fraction of tokens", False),
    ("frac_reward_zero_std", "Groups with no signal", [("frac_reward_zero_std", "zero-std groups")], "fraction", False),
    ("loss", "Training loss", [("loss", "loss")], "loss", False),
    ("tool_use", "Tool use (per completion)", [("tools/call_frequency", "calls"), ("tools/turns", "model turns")],
     "per completion", False),
)


def chart_svgs(data: RunData) -> list[tuple[str, str]]:
    """(title, inline SVG) of every curve the run's logs fill, the accuracy (logged, or the share of completions whose
    accuracy reward is above 0) after the reward components."""
    out = []
    keys_logged = list(dict.fromkeys(k for row in data.metrics for k in row))
    for name, title, keys, ylabel, log in CURVES:
        if keys is None:
            keys = [(f"rewards/{c}", c) for c in data.reward_components()]
        elif isinstance(keys, str):
            keys = [(k, k[len(keys):]) for k in keys_logged if k.startswith(keys)]
        series = [(label, *data.series(key)) for key, label in keys if data.has(key)]
        if series:
            out.append((title, line_chart(name, title, series, ylabel, log)))
        if name == "reward_components":
            accuracy = _accuracy_series(data)
            if accuracy is not None:
                out.append(("Accuracy", line_chart("accuracy", "Accuracy", [accuracy], "accuracy")))
    return out


def _accuracy_series(data: RunData):
    if data.has("accuracy"):
        return ("accuracy", *data.series("accuracy"))
    component = data.accuracy_component()
    if component and data.completions:
        steps, values = accuracy_per_step(data, component)
        if len(steps):
            return (f"{component} > 0", steps, values)
    return None
