"""Completions with their reward components, to spot reward hacking (`vlm-grpo completions RUN_DIR`).

Plain text, sized to the terminal. A completion that scores high for the wrong reason (a format tag
with no answer, a keyword stuffed in to please a component) is quickest to see next to its
components and its advantage, sorted best or worst first. Completions a guard flagged during training (an example
of a tripped hacking monitor: `flags` in completions.jsonl) are marked, and `flagged=True` keeps only them.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any, Iterable

from vlm_grpo.grpo.run.logs import COMPLETIONS, read_jsonl
from vlm_grpo.terminal import printable as one_line


def load_completions(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / COMPLETIONS
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a training run directory?")
    return read_jsonl(path)


def select(
    rows: list[dict[str, Any]], *, step: int | None = None, order: str = "log", limit: int | None = None,
    sort_key: str = "reward", flagged: bool = False,
) -> list[dict[str, Any]]:
    """Filter to `step` (-1: the last logged step) and, with `flagged`, to completions a guard flagged; sort
    (`best`/`worst` by `sort_key`, or log order), cut to `limit`.

    `sort_key` is "reward", "advantage" or a reward component's name. Ties keep log order.
    """
    if step is not None:
        if step == -1 and rows:
            step = max(int(r["step"]) for r in rows)
        rows = [r for r in rows if int(r["step"]) == step]
    if flagged:
        rows = [r for r in rows if r.get("flags")]
    if order in ("best", "worst"):
        def key(r):
            value = r.get(sort_key, r.get("rewards", {}).get(sort_key))
            return float("-inf") if value is None else float(value)

        rows = sorted(rows, key=key, reverse=order == "best")
    elif order != "log":
        raise ValueError(f"unknown order {order!r}")
    return rows[:limit] if limit else rows


def printable(text: str) -> str:
    """Control characters shown as escapes so a completion cannot garble the terminal."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("⏎ ")
        elif ch == "\t":
            out.append(" ")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def tool_summary(turns: list[dict[str, Any]]) -> str:
    """'tools: 2 calls (1 failed), 1 image, 3 model turns' for a completion's logged messages."""
    calls = sum(len(m.get("tool_calls") or []) for m in turns if m.get("role") == "assistant")
    results = [m for m in turns if m.get("role") == "tool"]
    failed = sum(isinstance(m.get("content"), str) and m["content"].startswith('{"error"') for m in results)
    images = sum(p.get("type") == "image" for m in results if isinstance(m.get("content"), list) for p in m["content"])
    said = sum(m.get("role") == "assistant" for m in turns)
    return (f"tools: {calls} call{'s' * (calls != 1)}" + (f" ({failed} failed)" if failed else "")
            + f", {images} image{'s' * (images != 1)}, {said} model turn{'s' * (said != 1)}")


def _num(v: Any) -> str:
    return "-" if v is None else f"{float(v):+.3f}" if isinstance(v, (int, float)) else one_line(v)


def format_rows(rows: Iterable[dict[str, Any]], *, width: int | None = None, max_lines: int = 6,
                show_prompt: bool = False) -> str:
    """One block per completion: a header (step, sample, reward, advantage, components) and the text."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    width = max(40, width)
    blocks = []
    for n, r in enumerate(rows, 1):
        # every field of the run's log is shown through one_line: a reward's name or a flag may hold escapes too
        comps = "  ".join(f"{one_line(k)}={_num(v)}" for k, v in (r.get("rewards") or {}).items())
        head = (
            f"#{n} step {one_line(r.get('step'))}  sample {one_line(r.get('sample_index'))}  "
            f"proc {one_line(r.get('process', 0))}  reward {_num(r.get('reward'))}  adv {_num(r.get('advantage'))}"
            + (f"  FLAGGED: {', '.join(map(one_line, r['flags']))}" if r.get("flags") else "")
        )
        lines = textwrap.wrap(head, width) + textwrap.wrap("   " + comps, width, subsequent_indent="   ")
        if r.get("turns"):  # a multi-turn rollout with tools: what it did, before the trajectory itself
            lines += textwrap.wrap("   " + tool_summary(r["turns"]), width, subsequent_indent="   ")
        if show_prompt:
            lines += textwrap.wrap(printable(str(r.get("prompt", ""))), width, initial_indent="   prompt: ",
                                   subsequent_indent="           ")
        body = textwrap.wrap(printable(str(r.get("completion", ""))) or "∅", width - 3, initial_indent="│ ",
                             subsequent_indent="│ ", drop_whitespace=False)
        if len(body) > max_lines:
            body = body[: max_lines - 1] + [f"│ … ({len(body) - max_lines + 1} more lines)"]
        blocks.append("\n".join(lines + body))
    rule = "─" * min(width, 100)
    return ("\n" + rule + "\n").join(blocks)


def summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no completions match"
    rewards = [float(r.get("reward", 0.0)) for r in rows]
    steps = sorted({int(r["step"]) for r in rows})
    where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
    flagged = sum(bool(r.get("flags")) for r in rows)
    return (f"{len(rows)} completions, {where}, reward mean {sum(rewards) / len(rewards):.3f} (min {min(rewards):.3f}, "
            f"max {max(rewards):.3f})" + (f", {flagged} flagged by a guard" if flagged else ""))
