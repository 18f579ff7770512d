"""What a GRPO run watches besides instability (README, "Reward hacking and grounding guards"):

- at the start (main process), the reward audit on the first samples (grpo/rewards/audit.py), its result in
  `reward-audit.json` and a warning per exploit found;
- each step (one call from the trainer, after the update), the statistics the monitors judge (hacking_monitors.py):
  identical groups, completions listing several allowed answers, completions cut at the length limit, the share of
  right answers, each reward's mean and largest value; every `reliance_every` steps image reliance and the
  attention-to-image share (image_reliance.py). All averaged over processes, so every process judges alike;
  and the answer marginal, over every process's completions: the share of the commonest stated answer, overall and
  per question type (`guards/answer_share[/<type>]` in metrics.jsonl), which rises when the policy drifts to one answer;
- a tripped monitor warns once per cause with example completions, is counted every step it holds
  (`guards/trips/<monitor>`), flags the completions that show it in completions.jsonl and, with
  `guard.on_hacking stop`, asks the loop to save the step and stop (`halt`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections import Counter
from typing import Any, Callable

import torch

from vlm_grpo.grpo.algorithm.trajectory import Trajectory
from vlm_grpo.grpo.rewards.audit import audit_rewards, completion_tokens
from vlm_grpo.grpo.rewards.audit_bounds import AUDIT_ROWS, audit_rows
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.guard_report import AUDIT_FILE
from vlm_grpo.grpo.guards.protocol import Trip
from vlm_grpo.grpo.guards.hacking_monitors import monitors
from vlm_grpo.grpo.guards.image_reliance import ImageReliance
from vlm_grpo.recipes.audit_hints import DEFAULT_HINTS, AuditHints

log = logging.getLogger(__name__)
ACCURACY_NAMES = ("accuracy", "correctness")
EXAMPLES = 3  # completions shown with a warning


def run_hints(recipe, custom_rewards: bool) -> AuditHints:
    """The recipe's audit hints; exploits it accepts apply only to its own rewards, not ones the run names."""
    hints = recipe.audit or DEFAULT_HINTS
    return dataclasses.replace(hints, accepted={}) if custom_rewards else hints


def accuracy_component(recipe, rewards) -> str | None:
    """The reward that means "the answer is right": the recipe's, else one named accuracy or correctness."""
    names = [r.name for r in rewards]
    for name in (recipe.accuracy_reward, *ACCURACY_NAMES):
        if name in names:
            return name
    return None


def enumerates(span: str, candidates: list[str]) -> bool:
    """Whether an answer lists several allowed answers (at least 3, or all when fewer are allowed)."""
    if len(candidates) < 2:
        return False
    found = {c for c in candidates if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", span, flags=re.IGNORECASE)}
    return len(found) >= min(3, len(candidates))


def _candidates(hints: AuditHints, sample) -> list[str]:
    try:
        answer = hints.answer(sample)
        return hints.candidates(sample, answer) if answer is not None else []
    except (KeyError, TypeError, ValueError):  # a sample without the fields the hints read
        return []


def completion_stats(traj: Trajectory, samples, hints: AuditHints, accuracy: str | None,
                     limit: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """(statistics of this process's completions, the rows that show each problem)."""
    g, texts = traj.num_generations, traj.completions
    groups = len(texts) // g
    candidates = [_candidates(hints, s) for s in samples]
    rows = {
        "identical_groups": [k * g + j for k in range(groups) if len(set(texts[k * g:(k + 1) * g])) == 1 for j in range(g)],
        "enumeration": [i for i, t in enumerate(texts) if enumerates(hints.span(t), candidates[i // g])],
        "length_limit": [i for i, n in enumerate(traj.completion_mask.sum(1).tolist()) if n >= limit],
    }
    n = max(len(texts), 1)
    stats = {"guards/identical_groups": len(rows["identical_groups"]) / n,
             "guards/enumeration": len(rows["enumeration"]) / n, "guards/at_length_limit": len(rows["length_limit"]) / n}
    right = None
    if accuracy is not None:
        acc = traj.reward_components[accuracy]
        present = ~torch.isnan(acc)
        stats["guards/accuracy_rate"] = float((acc[present] > 0).float().mean()) if present.any() else math.nan
        right = torch.nan_to_num(acc, nan=0.0) > 0
    for name, values in traj.reward_components.items():
        present = values[~torch.isnan(values)]
        stats[f"rewards/{name}"] = float(present.mean()) if present.numel() else math.nan
        stats[f"max/{name}"] = float(present.max()) if present.numel() else 0.0
        if right is not None and name != accuracy:  # paid although the answer is wrong
            rows[f"paid/{name}"] = [i for i in range(len(texts)) if values[i] > 0 and not right[i]]
    return stats, rows


def stated_answers(traj: Trajectory, samples, hints: AuditHints) -> list[dict[str, str | None]]:
    """Each completion's stated answer (the recipe's answer span, trimmed, lower-cased), its prompt's question type
    (the sample's `question_type` field, "" when it names none) and its prompt's right answer, alike (None when the
    recipe names none)."""
    g = traj.num_generations
    return [answer_row(samples[i // g], text, hints) for i, text in enumerate(traj.completions)]


def answer_row(sample, completion: str, hints: AuditHints) -> dict[str, str | None]:
    """One completion's row of stated_answers."""
    return {"type": str((getattr(sample, "fields", None) or {}).get("question_type") or ""),
            "answer": plain(hints.span(completion)), "right": right_answer(hints, sample)}


def plain(text: str) -> str:
    return " ".join(text.split()).lower()


def right_answer(hints: AuditHints, sample) -> str | None:
    try:
        answer = hints.answer(sample)
    except (AttributeError, KeyError, TypeError, ValueError):  # a sample without the fields the hints read
        return None
    return None if answer is None else plain(str(answer))


def answer_marginal(rows: list[dict[str, str | None]]) -> dict[str, float]:
    """The share of the commonest stated answer among the step's completions (`guards/answer_share`), and for each
    question type (`guards/answer_share/<type>`); beside each, where every prompt names its right answer, the share
    the commonest right answer holds among the same completions (`guards/right_answer_share[/<type>]`): what a policy
    answering every prompt right would show. A step asks a handful of prompts, so the two are read together: a policy
    that drifts to one answer whatever the image shows puts the first above the second."""
    if not rows:
        return {}
    groups: dict[str, list[dict[str, str | None]]] = {"": list(rows)}
    for r in rows:
        if r["type"]:
            groups.setdefault(r["type"], []).append(r)
    out = {}
    for kind, members in groups.items():
        suffix = f"/{kind.replace(' ', '_')}" if kind else ""
        out["guards/answer_share" + suffix] = share_of_commonest([r["answer"] for r in members])
        rights = [r.get("right") for r in members]
        if None not in rights:
            out["guards/right_answer_share" + suffix] = share_of_commonest(rights)
    return out


def share_of_commonest(values: list) -> float:
    return Counter(values).most_common(1)[0][1] / len(values)


class HackingWatch:
    def __init__(self, ctx, data, policy, score: Callable[[Trajectory, list[int]], torch.Tensor]):
        """`data`: the run's recipe, rewards and training split; `score(traj, rows)`: the policy's log-probs of
        those rows, without gradient (image reliance compares them with blanked and swapped images)."""
        cfg = ctx.cfg
        self.ctx, self.data, self.run_cfg, self.cfg = ctx, data, cfg, cfg.guard
        self.hints = run_hints(data.recipe, custom_rewards=bool(cfg.data.rewards))
        self.accuracy = accuracy_component(data.recipe, data.rewards)
        fixed = cfg.generation.min_new_tokens >= cfg.generation.max_new_tokens  # benchmarks: no early stop at all
        self.monitors = monitors(cfg.guard, self.accuracy, fixed_length=fixed)
        self.trips = {name: 0 for name in self.monitors.by_name}
        self.warned: set[str] = set()
        self.halt: str | None = None  # why the loop should stop after saving this step (on_hacking stop)
        self.flagged: dict[int, list[str]] = {}  # this step's completions -> the monitors they are examples of
        self.adapter = policy.adapter
        self.reliance = ImageReliance(policy.adapter, ctx.device, score=score, attention=not policy.sharded)
        if self.cfg.audit_at_start and ctx.is_main:
            self.audit()

    # ---------------------------------------------------------------- the audit at the start
    def audit(self) -> None:
        data, cfg, run_dir = self.data, self.run_cfg, self.ctx.run_dir
        samples = [data.dataset[i] for i in audit_rows(len(data.dataset), cfg.seed, AUDIT_ROWS)]
        limit = cfg.generation.max_new_tokens
        encode = completion_tokens(self.adapter.tokenizer, (self.adapter.eos_token_ids or [None])[0], limit)
        report = audit_rewards(data.rewards, samples, self.hints, encode=encode, padding_words=2 * limit,
                               max_steps=cfg.max_steps, timeout=cfg.data.reward_timeout or None)
        allow = self.cfg.audit_allow
        safe_files.write_run_file(run_dir, AUDIT_FILE, json.dumps(report.to_dict(allow), indent=1, default=float) + "\n")
        for finding in report.flags(allow):
            log.warning("reward audit: %s: a policy can earn it without solving the task (vlm-grpo audit-rewards "
                        "shows the table; guard.audit_allow silences it)", finding.line())
        accepted = report.accepted_lines(allow)
        print(f"reward audit ({report.samples} samples): {len(report.flags(allow))} exploits flagged, {len(accepted)} "
              f"accepted by the recipe or guard.audit_allow; details in {run_dir / AUDIT_FILE}")
        if report.errors:
            log.warning("reward audit: rewards raised on adversarial completions: %s", report.errors)

    # ---------------------------------------------------------------- each step
    def step(self, step: int, samples, traj: Trajectory) -> dict[str, float]:
        """The step's guard metrics (process means), after the monitors judged them."""
        stats, rows = completion_stats(traj, samples, self.hints, self.accuracy, self.run_cfg.generation.max_new_tokens)
        if self.cfg.reliance_every and step % self.cfg.reliance_every == 0:
            measured = self.reliance.measure(samples, traj, self.cfg.reliance_samples)
            stats.update(measured)
            rows["reliance"] = self.reliance.rows
        stats = self.ctx.mean_over_processes(stats)
        # over every process's completions at once: the question types in each process's batch differ
        stats.update(answer_marginal(self.ctx.gather_rows(stated_answers(traj, samples, self.hints))))
        stats["n/completions"] = len(traj) * self.ctx.accelerator.num_processes
        trips = self.monitors.observe(step + 1, stats, rows)
        self.flagged = {}
        for trip in trips:
            self._report(trip, traj)
        metrics = {k: v for k, v in stats.items() if k.startswith(("guards/", "grounding/"))}
        metrics.update({f"guards/trips/{name}": count for name, count in self.trips.items()})
        return metrics

    def _report(self, trip: Trip, traj: Trajectory) -> None:
        self.trips[trip.guard] += 1
        for row in trip.rows:
            self.flagged.setdefault(row, []).append(trip.guard)
        key = trip.key or trip.guard
        if self.cfg.on_hacking == "stop" and self.halt is None:
            self.halt = trip.message
        if key in self.warned:
            return
        self.warned.add(key)
        if not self.ctx.is_main:  # every process judges alike; one says so
            return
        shown = "; ".join(repr(_clip(traj.completions[r])) for r in trip.rows[:EXAMPLES]) or "-"
        log.warning("guard %s: %s. Examples: %s", trip.guard, trip.message, shown)

    def state_dict(self) -> dict[str, Any]:
        """The monitors' history, trip counts and what was warned of (JSON, for trainer_state.json)."""
        return {"trips": dict(self.trips), "warned": sorted(self.warned),
                "monitors": {name: m.state_dict() for name, m in self.monitors.by_name.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trips.update({k: int(v) for k, v in state["trips"].items() if k in self.trips})
        self.warned = set(state["warned"])
        for name, monitor_state in state["monitors"].items():
            if name in self.monitors.by_name:
                self.monitors.by_name[name].load_state_dict(monitor_state)

    def flags(self, row: int) -> dict[str, Any]:
        """completions.jsonl's `flags` of a completion of this step (nothing when none)."""
        return {"flags": self.flagged[row]} if row in self.flagged else {}


def _clip(text: str, n: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
