"""Rewards over a multi-turn conversation, as TRL hands it to rewards when the model uses tools: a list of
assistant messages (with `tool_calls`) and tool messages (`{"role": "tool", "name", "content"}`)."""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_USE_REWARD = 0.5


def messages_of(completion: Any) -> list[dict]:
    """A completion as messages (plain text: one assistant message)."""
    return completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]


def final_answer(completion: Any) -> str:
    """The text of the last assistant message (the answer after the tool turns)."""
    said = [m.get("content") or "" for m in messages_of(completion) if m.get("role") == "assistant"]
    content = said[-1] if said else ""
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def last_number(text: str) -> str | None:
    numbers = re.findall(r"\d+", text)
    return numbers[-1] if numbers else None


def _failed(content: Any) -> bool:
    if not isinstance(content, str):
        return False
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def tool_use(completions: list[Any], **_) -> list[float]:
    """+0.5 when the model called a tool, every call was well formed and none failed (no error came back, no
    unread `<tool_call>` was left in its text)."""
    out = []
    for completion in completions:
        messages = messages_of(completion)
        calls = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
        results = [m for m in messages if m.get("role") == "tool"]
        unread = any("<tool_call>" in (m.get("content") or "") for m in messages
                     if m.get("role") == "assistant" and isinstance(m.get("content"), str))
        good = calls > 0 and len(results) == calls and not unread and not any(_failed(m["content"]) for m in results)
        out.append(TOOL_USE_REWARD if good else 0.0)
    return out


def final_number_answer(completions: list[Any], answer: list[Any], **_) -> list[float]:
    """+1.0 when the last number of the final message is the row's `answer`."""
    return [1.0 if last_number(final_answer(c)) == str(a) else 0.0 for c, a in zip(completions, answer)]


def on_final_answer(fn):
    """`fn`, a reward written for one-turn text completions, scoring a multi-turn rollout by its final message's text
    (the answer after the tool turns); every other argument passes through."""
    import functools

    @functools.wraps(fn)  # keeps its name and signature: it is called with the arguments it names
    def reward(*args, completions, **kwargs):
        return fn(*args, completions=[final_answer(c) for c in completions], **kwargs)

    return reward
