"""The model card's guards section: what the grounding and reward-hacking guards measured and found in a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

from vlm_grpo.grpo.run.logs import METRICS, read_jsonl
from vlm_grpo.markdown_text import escaped

AUDIT_FILE = "reward-audit.json"  # written by the reward audit at the start of a GRPO run


def guard_lines(run_dir: Path) -> list[str]:
    """The card's guards section: image reliance and attention to the image (first and last measurement), how many
    steps each hacking monitor tripped, and the reward audit's findings (nothing when the run logged none)."""
    rows = read_jsonl(run_dir / METRICS) if (run_dir / METRICS).is_file() else []
    lines = []
    for key, what in (("grounding/image_reliance", "image reliance vs a blank image (nats/token)"),
                      ("grounding/image_reliance_swap", "image reliance vs another image (nats/token)"),
                      ("grounding/attention_to_image", "attention of answer tokens to the image")):
        seen = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if seen:
            lines.append(f"| {what} | {seen[0][1]:.3f} (step {seen[0][0]}) | {seen[-1][1]:.3f} (step {seen[-1][0]}) |")
    last = next((r for r in reversed(rows) if any(k.startswith("guards/trips/") for k in r)), {})
    trips = {k.split("/", 2)[2]: int(v) for k, v in last.items() if k.startswith("guards/trips/")}
    if not lines and not trips:
        return []
    out = ["## Grounding and reward-hacking guards", ""]
    if lines:
        out += ["| measured on sampled completions | first | last |", "| --- | --- | --- |", *lines, ""]
    if trips:
        out += ["Steps each monitor tripped: " + ", ".join(f"{name} {n}" for name, n in trips.items()) + ".", ""]
    audit = run_dir / AUDIT_FILE
    if audit.is_file():
        report = json.loads(audit.read_text())
        # the audit's lines name rewards and quote completions: shown as the text they are
        found = [f"- {escaped(line)}" for line in [*report.get("flags", []), *report.get("accepted", [])]]
        out += [f"Reward audit at the start ({report.get('samples')} samples): "
                + (f"{len(report.get('flags', []))} exploits flagged" if found else "no exploit found") + ".", "",
                *found, *([""] if found else [])]
    return out
