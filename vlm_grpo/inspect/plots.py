"""Training curves from a run directory's logs: one PNG per chart plus an overview grid.

Reads metrics.jsonl (one line per step) and completions.jsonl (one line per completion) and writes
RUN_DIR/plots/*.png. Every chart shows the raw values as points and a smoothed line, so a noisy
curve and its trend read at a glance. Charts whose metric was never logged (e.g. KL with beta 0)
are skipped, not drawn empty.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.logs import COMPLETIONS, METRICS, read_jsonl
from vlm_grpo.grpo.safe_files import CreatedFiles

ACCURACY_COMPONENTS = ("accuracy", "correctness")  # reward components that mean "the answer is right"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


# ---------------------------------------------------------------- data
@dataclass
class RunData:
    run_dir: Path
    metrics: list[dict[str, Any]]
    completions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunData":
        run_dir = Path(run_dir)
        path = run_dir / METRICS
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: is {run_dir} a training run directory?")
        comp = run_dir / COMPLETIONS
        # the run's own logs only: a symlinked or hard-linked log could bring any file's lines into a report
        safe_files.run_file(run_dir, METRICS)
        if os.path.lexists(comp):
            safe_files.run_file(run_dir, COMPLETIONS)
        return cls(run_dir, read_jsonl(path), read_jsonl(comp) if comp.exists() else [])

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric, skipping steps where it is absent or not finite."""
        steps, values = [], []
        for i, row in enumerate(self.metrics):
            v = row.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                steps.append(row.get("step", i + 1))
                values.append(float(v))
        return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)

    def has(self, key: str) -> bool:
        return len(self.series(key)[0]) > 0

    def reward_components(self) -> list[str]:
        names: list[str] = []
        for row in self.metrics:
            for key in row:
                if key.startswith("rewards/") and key[len("rewards/"):] not in names:
                    names.append(key[len("rewards/"):])
        return names

    def accuracy_component(self, preferred: str | None = None) -> str | None:
        """The reward component that means "correct": `preferred`, else one named accuracy/correctness."""
        seen = set(self.reward_components())
        for row in self.completions[:1]:
            seen |= set(row.get("rewards", {}))
        if preferred:
            return preferred if preferred in seen else None
        return next((name for name in ACCURACY_COMPONENTS if name in seen), None)


def smooth(values: np.ndarray, weight: float | None = None) -> np.ndarray:
    """Debiased exponential moving average; the weight grows with the number of points (none below 10)."""
    n = len(values)
    if weight is None:
        weight = max(0.0, min(0.9, 1.0 - 10.0 / max(n, 1)))
    out, avg = np.empty(n), 0.0
    for i, v in enumerate(values):
        avg = weight * avg + (1 - weight) * v
        out[i] = avg / (1 - weight ** (i + 1)) if weight > 0 else v
    return out


def accuracy_per_step(data: RunData, component: str, threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Fraction of each step's completions whose `component` reward is above `threshold`."""
    by_step: dict[int, list[bool]] = {}
    for row in data.completions:
        value = row.get("rewards", {}).get(component)
        if value is not None:
            by_step.setdefault(int(row["step"]), []).append(float(value) > threshold)
    steps = sorted(by_step)
    return np.asarray(steps, dtype=float), np.asarray([np.mean(by_step[s]) for s in steps], dtype=float)


def completion_length(text: str, unit: str = "words") -> int:
    return len(text.split()) if unit == "words" else len(text)


def accuracy_by_length(
    data: RunData, component: str, *, unit: str = "words", buckets: int = 6, threshold: float = 0.0
) -> list[tuple[str, float, int]]:
    """(bucket label, accuracy, count) over completions grouped by length (quantile buckets)."""
    pairs = [
        (completion_length(row.get("completion", ""), unit), float(row["rewards"][component]) > threshold)
        for row in data.completions
        if component in row.get("rewards", {})
    ]
    if not pairs:
        return []
    lengths = np.asarray([p[0] for p in pairs])
    correct = np.asarray([p[1] for p in pairs])
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, buckets + 1)).round().astype(int))
    if len(edges) == 1:
        edges = np.asarray([edges[0], edges[0]])
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        last = i == len(edges) - 2
        sel = (lengths >= lo) & ((lengths <= hi) if last else (lengths < hi))
        if sel.any():
            top = hi if last else hi - 1
            label = f"{lo}" if lo == top else f"{lo}–{top}"
            out.append((label, float(correct[sel].mean()), int(sel.sum())))
    return out


# ---------------------------------------------------------------- charts
@dataclass
class Chart:
    name: str  # file stem
    title: str
    draw: Callable[[Any], None]  # draws on a matplotlib Axes


def _curve(ax, steps, values, label: str | None, color: str, log: bool = False) -> None:
    if log:
        keep = values > 0
        steps, values = steps[keep], values[keep]
    ax.plot(steps, values, "o", color=color, alpha=0.35, markersize=3.5, linestyle="none")
    ax.plot(steps, smooth(values), "-", color=color, linewidth=2, label=label)


def _line_chart(data: RunData, name: str, title: str, keys: list[tuple[str, str]], ylabel: str, log: bool = False):
    present = [(k, label) for k, label in keys if data.has(k)]
    if not present:
        return None

    def draw(ax):
        for (key, label), color in zip(present, PALETTE):
            steps, values = data.series(key)
            _curve(ax, steps, values, label if len(present) > 1 else None, color, log)
        if log:
            ax.set_yscale("log")
        _decorate(ax, title, "step", ylabel, legend=len(present) > 1)

    return Chart(name, title, draw)


def _decorate(ax, title: str, xlabel: str, ylabel: str, legend: bool = False) -> None:
    ax.set_title(title, fontsize=11, fontweight="bold")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=8, frameon=False)


def _accuracy_chart(data: RunData, component: str | None, threshold: float):
    if data.has("accuracy"):
        steps, values = data.series("accuracy")
        source = "metric accuracy"
    elif component and data.completions:
        steps, values = accuracy_per_step(data, component, threshold)
        source = f"share with {component} > {threshold:g}"
    else:
        return None
    if not len(steps):
        return None
    title = "Accuracy"

    def draw(ax):
        _curve(ax, steps, values, None, PALETTE[2])
        ax.set_ylim(-0.03, 1.03)
        _decorate(ax, title, "step", f"accuracy ({source})")

    return Chart("accuracy", title, draw)


def _heldout_chart(data: RunData):
    """Greedy accuracy on held-out samples (eval/accuracy: SFT's eval_every, GRPO's eval.before_after)."""
    if not data.has("eval/accuracy"):
        return None
    steps, values = data.series("eval/accuracy")
    title = "Held-out accuracy (greedy)"

    def draw(ax):
        ax.plot(steps, values, "o-", color=PALETTE[3], linewidth=2, markersize=5)
        for x, y in zip(steps, values):
            ax.annotate(f"{y:.0%}", (x, y), ha="center", va="bottom", fontsize=7, xytext=(0, 3), textcoords="offset points")
        ax.set_ylim(-0.03, 1.03)
        _decorate(ax, title, "step", "accuracy (held-out)")

    return Chart("heldout_accuracy", title, draw)


def _length_accuracy_chart(data: RunData, component: str | None, unit: str, threshold: float):
    if not component or not data.completions:
        return None
    rows = accuracy_by_length(data, component, unit=unit, threshold=threshold)
    if not rows:
        return None
    title = "Accuracy by reasoning length"

    def draw(ax):
        labels = [r[0] for r in rows]
        bars = ax.bar(range(len(rows)), [r[1] for r in rows], color=PALETTE[0], alpha=0.8)
        for bar, (_, acc, n) in zip(bars, rows):
            ax.annotate(f"{acc:.0%}\nn={n}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(rows)), labels, rotation=30 if len(rows) > 4 else 0, fontsize=8)
        ax.set_ylim(0, 1.2)
        _decorate(ax, title, f"completion length ({unit})", f"accuracy ({component} > {threshold:g})")

    return Chart("accuracy_by_length", title, draw)


def charts(data: RunData, *, accuracy_component: str | None = None, length_unit: str = "words",
           threshold: float = 0.0) -> list[Chart]:
    """The charts this run's logs can fill, in overview order."""
    component = data.accuracy_component(accuracy_component)
    comps = [(f"rewards/{c}", c) for c in data.reward_components()]
    trips = sorted({k for row in data.metrics for k in row if k.startswith("guards/trips/")})
    candidates = [
        _line_chart(data, "reward", "Reward (total)", [("reward", "reward")], "mean reward"),
        _line_chart(data, "loss", "Training loss", [("loss", "loss")], "loss"),
        _line_chart(data, "reward_components", "Reward components", comps, "mean reward"),
        _accuracy_chart(data, component, threshold),
        _heldout_chart(data),
        _line_chart(data, "kl", "KL to reference (log scale)", [("kl", "kl")], "KL", log=True),
        _line_chart(data, "completion_length", "Completion length", [("completion_length", "length")], "tokens"),
        _line_chart(
            data, "clip_fraction", "Clip fraction",
            [("clip_ratio/region_mean", "clipped (any)"), ("clip_ratio/low_mean", "low"),
             ("clip_ratio/high_mean", "high")],
            "fraction of tokens",
        ),
        _line_chart(data, "entropy", "Policy entropy", [("entropy", "entropy")], "nats / token"),
        _line_chart(data, "frac_reward_zero_std", "Groups with no signal",
                    [("frac_reward_zero_std", "zero-std groups")], "fraction of groups"),
        _line_chart(data, "tool_use", "Tool use (per completion)",
                    [("tools/call_frequency", "calls"), ("tools/turns", "model turns"), ("tools/images", "images returned")],
                    "per completion"),
        _line_chart(data, "tool_failures", "Tool failures",
                    [("tools/failure_frequency", "failed share of calls"), ("tools/malformed_calls", "malformed / completion"),
                     ("tools/timeouts", "timed out / completion")], "rate"),
        _line_chart(data, "image_reliance", "Image reliance (log-prob with the image - without)",
                    [("grounding/image_reliance", "vs a blank image"), ("grounding/image_reliance_swap", "vs another image")],
                    "nats / token"),
        _line_chart(data, "attention_to_image", "Attention of answer tokens to the image",
                    [("grounding/attention_to_image", "share")], "share of attention"),
        _line_chart(data, "hacking_signs", "Signs of reward hacking",
                    [("guards/identical_groups", "in identical groups"), ("guards/enumeration", "answers listed"),
                     ("guards/at_length_limit", "cut at the length limit")], "share of completions"),
        _line_chart(data, "guard_trips", "Guard trips (cumulative steps)",
                    [(k, k.rsplit("/", 1)[1]) for k in trips], "steps"),
        _length_accuracy_chart(data, component, length_unit, threshold),
    ]
    return [c for c in candidates if c is not None]


def write_plots(run_dir: str | Path, out_dir: str | Path | None = None, *, dpi: int = 100, **chart_kwargs) -> list[Path]:
    """All charts of a run as PNGs (out_dir defaults to RUN_DIR/plots), overview.png last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = RunData.load(run_dir)
    out = Path(out_dir) if out_dir else data.run_dir / "plots"
    listed = CreatedFiles(data.run_dir) if out_dir is None and CreatedFiles(data.run_dir).exists else None
    if listed is not None:  # the run's own folder: claimed (refused when it is not the run's), never a link
        listed.add(out.name)
    safe_files.check_path(out)
    out.mkdir(parents=True, exist_ok=True)
    if listed is not None:
        listed.record(out.name)
    made = charts(data, **chart_kwargs)
    if not made:
        raise ValueError(f"{data.run_dir / METRICS} holds no plottable metrics")
    written = []
    for chart in made:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        chart.draw(ax)
        fig.tight_layout()
        path = out / f"{chart.name}.png"
        _save(fig, path, dpi)
        plt.close(fig)
        written.append(path)
    ncols = 3 if len(made) > 4 else 2
    nrows = -(-len(made) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(made):]:
        ax.axis("off")
    for ax, chart in zip(axes.flat, made):
        chart.draw(ax)
    last = int(data.metrics[-1].get("step", len(data.metrics)))
    steps = sum("stage" not in row for row in data.metrics)  # held-out evaluation rows carry a stage
    fig.suptitle(f"{data.run_dir.name}: {steps} logged steps (last step {last})", fontsize=13)
    fig.tight_layout()
    path = out / "overview.png"
    _save(fig, path, dpi)
    plt.close(fig)
    written.append(path)
    return written


def _save(fig, path: Path, dpi: int) -> None:
    """The chart rendered in memory, then written whole to a fresh file (never through a link)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    safe_files.write_file(path, buffer.getvalue())
