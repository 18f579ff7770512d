"""Every guard answers a step the same way: `observe(step, metrics, rows)` returns a list of Trips, empty when the
step shows nothing, each naming its guard and the step; one that must stop the run raises TrainingHalted."""

from __future__ import annotations

import math

import pytest

from vlm_grpo.grpo.guards.hacking_monitors import monitors
from vlm_grpo.grpo.guards.protocol import Guards, TrainingHalted, Trip
from vlm_grpo.grpo.guards.watchdogs import KLWatchdog, LearningSignalMonitor, NonFiniteGuard
from vlm_grpo.grpo.settings.sections import GuardConfig

CFG = GuardConfig(monitor_window=6)


def monitor(name: str):
    return lambda: monitors(CFG, "accuracy", fixed_length=False).by_name[name]  # fresh: monitors keep history


def series(n: int, **keys) -> list[dict]:
    return [{key: (values[k] if isinstance(values, list) else values) for key, values in keys.items()} for k in range(n)]


# guard, a quiet run, a run whose last step trips it
CASES = {
    "kl_spike": (lambda: KLWatchdog(CFG), series(5, kl=0.01), series(5, kl=[0.01, 0.01, 0.01, 0.01, 5.0])),
    "learning_signal": (lambda: LearningSignalMonitor(temperature=1.0),
                        series(3, frac_reward_zero_std=0.0, reward=0.5, reward_std=0.2),
                        series(3, frac_reward_zero_std=1.0, reward=0.5, reward_std=0.2)),
    "unused_reward": (lambda: LearningSignalMonitor(temperature=1.0), series(1, **{"rewards/format": 0.5}),
                      series(1, **{"rewards/format": math.nan})),
    "rising_component": (monitor("rising_component"),
                         series(6, **{"rewards/format": 0.2, "max/format": 1.0, "guards/accuracy_rate": 0.3}),
                         series(6, **{"rewards/format": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], "max/format": 1.0,
                                      "guards/accuracy_rate": 0.3, "n/completions": 128})),
    "image_reliance": (monitor("image_reliance"), series(2, **{"grounding/image_reliance": 1.0}),
                       series(1, **{"grounding/image_reliance": 0.001})),
    "identical_groups": (monitor("identical_groups"), series(2, **{"guards/identical_groups": 0.1}),
                         series(2, **{"guards/identical_groups": 0.9})),
    "enumeration": (monitor("enumeration"), series(6, **{"guards/enumeration": 0.1}),
                    series(6, **{"guards/enumeration": [0.0, 0.0, 0.1, 0.2, 0.4, 0.5]})),
    "length_limit": (monitor("length_limit"), series(6, **{"guards/at_length_limit": 0.1}),
                     series(6, **{"guards/at_length_limit": [0.1, 0.2, 0.4, 0.5, 0.7, 0.8]})),
}


def answers(guard, steps: list[dict]) -> list:
    return [guard.observe(k + 1, metrics, {}) for k, metrics in enumerate(steps)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_guard_returns_a_list_of_trips(case):
    make, quiet, tripping = CASES[case]
    assert answers(make(), quiet)[-1] == []
    said = answers(make(), tripping)
    assert all(isinstance(a, list) and all(isinstance(t, Trip) for t in a) for a in said)
    guard = make()
    last = answers(guard, tripping)[-1]
    assert last and all(t.guard == guard.name and f"{len(tripping)}" in t.message for t in last)


def test_a_guard_that_stops_the_run_raises_and_otherwise_returns_no_trip():
    guard = NonFiniteGuard(limit=2)
    assert guard.observe(1, {"loss": 0.5, "skipped_updates": 0}, {}) == []
    assert guard.observe(2, {"loss": math.nan}, {}) == []
    with pytest.raises(TrainingHalted, match="2 consecutive steps .* up to step 3"):
        guard.observe(3, {"loss": 0.5, "skipped_updates": 1}, {})


def test_guards_run_in_order_and_keep_each_by_name():
    guards = Guards([KLWatchdog(CFG), LearningSignalMonitor(temperature=1.0)])
    assert list(guards.by_name) == ["kl_spike", "learning_signal"]
    said = [guards.observe(k + 1, {"kl": kl, "rewards/format": math.nan})
            for k, kl in enumerate([0.01, 0.01, 0.01, 5.0])]
    assert [[t.guard for t in step] for step in said] == [["learning_signal"], [], [], ["kl_spike"]]
