"""Line charts as small inline SVG text, for report.html: a run's curves in a few milliseconds each (matplotlib takes
a quarter of a second per chart, which every train command would pay for its report) and a few kilobytes, with no
script and nothing to load. Raw values are points, the trend a smoothed line (inspect/plots.py's `smooth`), as in
the PNG charts."""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

from vlm_grpo.inspect.plots import PALETTE, smooth

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
