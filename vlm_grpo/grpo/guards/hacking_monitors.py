"""Monitors for a policy that games its rewards or stops looking at the image, judged once per step.

Each monitor is a guard (protocol.py): its `observe(step, stats, rows)` reads the step's process-averaged statistics (the
`Trend` of a metric over the last `window` steps: the mean of its first third against the mean of its last third) and,
when it trips, returns a `Trip`: a message naming the step, and which of the step's completions show it (`rows`: this
process's completions by what they show). The statistics are made in hacking_watch.py. Their state (`state_dict`) travels in
checkpoints, so a resumed run judges as the uninterrupted one.

- rising component, flat accuracy: a reward component gains `rise` of its largest value over the window while the
  share of right completions moves less than `flat` plus twice the sampling noise of that difference (with n
  completions a step and m steps a third, sqrt(p(1-p) * 2 / (n m)));
- image reliance falling toward zero: the mean of the last 3 measurements below `reliance_floor` of the mean of
  the first 3 (or ~0 at the first measurement);
- identical groups: all G completions identical in at least `identical_groups` of the groups, 2 steps in a row;
- enumeration rising: the share of completions listing several allowed answers gains `enumeration_rise`;
- length drifting to the limit: at least `length_limit_share` of completions cut at the length limit, having
  risen by 0.2 over the window (a model that never stopped early does not trip it).
"""

from __future__ import annotations

import math

from vlm_grpo.grpo.guards.protocol import Guards, Trip

MIN_POINTS = 6  # steps a trend needs before it is judged (fewer when the window is shorter): thirds of 2 steps
RELIANCE_NONE = 0.01  # nats per token: an image reliance this small means the answers ignore the image
SMOOTH = 3  # image reliance measurements averaged before judging
LENGTH_DRIFT = 0.2  # rise of the share of completions cut at the limit that counts as a drift



class Trend:
    """A metric's values over the last `window` steps; early and late: the means of the first and last thirds."""

    def __init__(self, window: int):
        self.window, self.values = window, []

    def state_dict(self) -> list[float]:
        return list(self.values)

    def load_state_dict(self, values: list[float]) -> None:
        self.values = [float(v) for v in values]

    def add(self, value: float) -> None:
        if value is not None and not math.isnan(value):
            self.values = (self.values + [float(value)])[-self.window:]

    @property
    def ready(self) -> bool:
        return len(self.values) >= min(self.window, MIN_POINTS)

    def _third(self) -> int:
        return max(1, len(self.values) // 3)

    @property
    def early(self) -> float:
        return sum(self.values[: self._third()]) / self._third()

    @property
    def late(self) -> float:
        return sum(self.values[-self._third():]) / self._third()

    def noise(self, per_step: float) -> float:
        """Standard error of late - early for a share measured on `per_step` completions a step."""
        p = min(max((self.early + self.late) / 2, 0.0), 1.0)
        return math.sqrt(p * (1 - p) * 2 / max(per_step * self._third(), 1.0))


class RisingWithoutAccuracy:
    name = "rising_component"

    def __init__(self, cfg, accuracy: str | None):
        self.cfg, self.accuracy = cfg, accuracy
        self.trends: dict[str, Trend] = {}
        self.scale: dict[str, float] = {}  # largest value a completion got for the component so far
        self.accuracy_trend = Trend(cfg.monitor_window)

    def state_dict(self) -> dict:
        return {"trends": {k: t.state_dict() for k, t in self.trends.items()}, "scale": dict(self.scale),
                "accuracy": self.accuracy_trend.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for name, values in state["trends"].items():
            self.trends.setdefault(name, Trend(self.cfg.monitor_window)).load_state_dict(values)
        self.scale = {k: float(v) for k, v in state["scale"].items()}
        self.accuracy_trend.load_state_dict(state["accuracy"])

    def observe(self, step: int, stats: dict[str, float], rows: dict[str, list[int]]) -> list[Trip]:
        if self.accuracy is None:
            return []
        self.accuracy_trend.add(stats.get("guards/accuracy_rate", math.nan))
        trips = []
        for name, value in stats.items():
            if not name.startswith("rewards/") or name == f"rewards/{self.accuracy}":
                continue
            component = name.split("/", 1)[1]
            trend = self.trends.setdefault(component, Trend(self.cfg.monitor_window))
            trend.add(value)
            self.scale[component] = max(self.scale.get(component, 0.0), stats.get(f"max/{component}", 0.0))
            acc = self.accuracy_trend
            if not (trend.ready and acc.ready and self.scale[component] > 0):
                continue
            rise = (trend.late - trend.early) / self.scale[component]
            flat = self.cfg.hacking_flat + 2 * acc.noise(stats.get("n/completions", 1.0))
            if rise >= self.cfg.hacking_rise and abs(acc.late - acc.early) <= flat:
                trips.append(Trip(self.name, (
                    f"step {step}: reward {component!r} rose by {rise:.0%} of its largest value ({trend.early:.3g} -> "
                    f"{trend.late:.3g}) over the last {len(trend.values)} steps while the share of right answers "
                    f"({self.accuracy!r} > 0) did not move beyond noise ({acc.early:.0%} -> {acc.late:.0%}): it is "
                    "being earned without getting answers right"), rows.get(f"paid/{component}", []), key=f"{self.name}:{component}"))
        return trips


class RelianceFalling:
    """Measurements on a few prompts are noisy (the default run's: 0.2-1.6 nats/token): the mean of the last
    `SMOOTH` measurements is judged against the mean of the first `SMOOTH`."""

    name = "image_reliance"

    def __init__(self, cfg):
        self.cfg, self.values = cfg, []

    def state_dict(self) -> dict:
        return {"values": list(self.values)}

    def load_state_dict(self, state: dict) -> None:
        self.values = [float(v) for v in state["values"]]

    def observe(self, step: int, stats: dict[str, float], rows: dict[str, list[int]]) -> list[Trip]:
        value = stats.get("grounding/image_reliance")
        if value is None or math.isnan(value):
            return []
        self.values.append(float(value))
        if len(self.values) == 1 and value <= RELIANCE_NONE:
            return [Trip(self.name, f"step {step}: image reliance {value:.3g} nats/token: the policy's answers "
                         "are as likely with a blank image as with theirs (the model does not use the image)",
                         rows.get("reliance", []))]
        first, last = self.values[:SMOOTH], self.values[-SMOOTH:]
        baseline, now = sum(first) / len(first), sum(last) / len(last)
        if len(self.values) > SMOOTH and baseline > RELIANCE_NONE and now <= self.cfg.reliance_floor * baseline:
            return [Trip(self.name, f"step {step}: image reliance fell to {now:.3g} nats/token (mean of the last "
                         f"{len(last)} measurements) from {baseline:.3g} (the first {len(first)}): the answers depend "
                         "less and less on the image", rows.get("reliance", []))]
        return []


class IdenticalGroups:
    name = "identical_groups"

    def __init__(self, cfg, patience: int = 2):
        self.cfg, self.patience, self.streak = cfg, patience, 0

    def state_dict(self) -> dict:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.streak = int(state["streak"])

    def observe(self, step: int, stats: dict[str, float], rows: dict[str, list[int]]) -> list[Trip]:
        share = stats.get("guards/identical_groups", 0.0)
        self.streak = self.streak + 1 if share >= self.cfg.identical_groups else 0
        if self.streak < self.patience:
            return []
        return [Trip(self.name, f"step {step}: in {share:.0%} of the groups all completions were identical, "
                     f"{self.streak} steps in a row: the policy has collapsed onto one answer per prompt (no learning "
                     "signal left; sample hotter, or check what it learned)", rows.get(self.name, []))]


class RisingShare:
    """A per-step share (enumeration, cut at the limit) that rises over the window."""

    def __init__(self, name: str, key: str, rise: float, level: float, what: str, window: int):
        self.name, self.key, self.rise, self.level, self.what = name, key, rise, level, what
        self.trend = Trend(window)

    def state_dict(self) -> dict:
        return {"trend": self.trend.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.trend.load_state_dict(state["trend"])

    def observe(self, step: int, stats: dict[str, float], rows: dict[str, list[int]]) -> list[Trip]:
        self.trend.add(stats.get(self.key, math.nan))
        t = self.trend
        if not t.ready or t.late < self.level or t.late - t.early < self.rise:
            return []
        return [Trip(self.name, f"step {step}: {self.what} rose from {t.early:.0%} to {t.late:.0%} of the "
                     f"completions over the last {len(t.values)} steps", rows.get(self.name, []))]


def monitors(cfg, accuracy: str | None, fixed_length: bool) -> Guards:
    """Every monitor of a run, by name (the length monitor only when completions may stop early)."""
    out = [RisingWithoutAccuracy(cfg, accuracy), RelianceFalling(cfg), IdenticalGroups(cfg),
           RisingShare("enumeration", "guards/enumeration", cfg.enumeration_rise, cfg.enumeration_rise,
                       "listing several allowed answers", cfg.monitor_window)]
    if not fixed_length:
        out.append(RisingShare("length_limit", "guards/at_length_limit", LENGTH_DRIFT, cfg.length_limit_share,
                               "completions cut at the length limit", cfg.monitor_window))
    return Guards(out)
