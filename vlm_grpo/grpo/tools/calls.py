"""Running the model's tool calls, as TRL 1.16 runs them, plus a time limit that holds.

A call runs `function(**arguments)` through the one guarded call site of user code (grpo/user_calls.py): an async
function is awaited on the shared event loop (a daemon thread, as TRL's), async calls of one turn together; with a
time limit a sync one runs in a thread that is stopped when it overruns, or in a killed worker process
(`isolation="process"`). A call that raises, names no known tool, or does not return within the time limit sends its
error back to the model as the result (`{"error": "..."}`) and counts as failed (`on_error="model"`, TRL's way), or
stops the run naming the tool (`on_error="raise"`). A tool that calls sys.exit() always stops the run. What a tool
may return:
- text: a str, a number, None, or a JSON-able dict / list (written as JSON);
- an image: a PIL image;
- both: a list of content parts (`{"type": "text", "text": ...}`, `{"type": "image", "image": <PIL>}`, bare strings
  and PIL images allowed), TRL's multimodal tool response.
Anything else (bytes, arrays, tensors, objects) is a ToolResultError naming the tool: a bug in the tool, not a move
of the model, so it stops the run.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from PIL import Image

from vlm_grpo.grpo.user_calls import UserCodeError, call, location, settle_all


class ToolResultError(TypeError):
    """A tool returned something that is neither text, an image, nor content parts."""


@dataclass
class ToolResult:
    name: str
    content: str | list[dict[str, Any]]  # TRL's tool-message content: text, or parts (images as PIL)
    failed: bool = False
    timed_out: bool = False
    images: list[Image.Image] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        return {"role": "tool", "name": self.name, "content": self.content}


def _part(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Image.Image):
        return {"type": "image", "image": value}
    if isinstance(value, str):
        return {"type": "text", "text": value}
    if isinstance(value, dict) and value.get("type") == "image" and isinstance(value.get("image"), Image.Image):
        return {"type": "image", "image": value["image"]}
    if isinstance(value, dict) and value.get("type") == "text" and isinstance(value.get("text"), str):
        return {"type": "text", "text": value["text"]}
    raise ToolResultError(f"tool {name!r} returned a list holding a {type(value).__name__}: a content part is "
                          "{'type': 'text', 'text': str}, {'type': 'image', 'image': <PIL image>}, a str or a PIL image")


def _is_parts(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and any(
        isinstance(v, Image.Image) or (isinstance(v, dict) and v.get("type") in ("text", "image")) for v in value)


def tool_content(name: str, value: Any) -> tuple[str | list[dict[str, Any]], list[Image.Image]]:
    """(TRL's tool-message content, the images in it) for what tool `name` returned."""
    if isinstance(value, Image.Image) or _is_parts(value):
        parts = [_part(name, v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        return parts, [p["image"] for p in parts if p["type"] == "image"]
    if isinstance(value, str):
        return value, []
    if value is None or isinstance(value, (bool, int, float)):
        return str(value), []
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, ensure_ascii=False), []
        except (TypeError, ValueError):
            pass
    raise ToolResultError(f"tool {name!r} returned a {type(value).__name__}, which is not a tool result: return text "
                          "(str, a number, a JSON-able dict or list), a PIL image, or a list of content parts")


def _failure(name: str, err: BaseException) -> ToolResult:
    cause = getattr(err, "cause", None) or getattr(err, "what", None) or err  # the tool's own words, for the model
    content, _ = tool_content(name, {"error": str(cause) or type(cause).__name__})
    return ToolResult(name, content, failed=True, timed_out=bool(getattr(err, "timed_out", False)))


def _result(name: str, fn: Callable, value: Any) -> ToolResult:
    try:
        content, images = tool_content(name, value)
    except ToolResultError as err:  # a bug in the tool, not a move of the model: the run stops, naming it
        raise UserCodeError("tool", name, location(fn), str(err).replace(f"tool {name!r} ", "", 1)) from None
    return ToolResult(name, content, images=images)


def _settle(name: str, fn: Callable, ok: bool, value: Any, on_error: str) -> ToolResult:
    if ok:
        return _result(name, fn, value)
    if value.exited or on_error == "raise":
        raise value
    return _failure(name, value)


def run_calls(calls: list[dict[str, Any]], functions: dict[str, Callable], timeout: float | None,
              isolation: str = "thread", on_error: str = "model", context: dict[str, Any] | None = None,
              ) -> list[ToolResult]:
    """The results of one turn's calls ({"name", "arguments"} each), in call order; async ones run concurrently.
    Methods (an environment's) always run in this process: their instance's state must persist."""
    results: list[ToolResult | None] = [None] * len(calls)
    pending = []
    for k, item in enumerate(calls):
        name, fn = item["name"], functions.get(item["name"])
        if fn is None:
            results[k] = _failure(name, ValueError(f"Tool {name} not found."))
        elif inspect.iscoroutinefunction(fn) and (isolation == "thread" or inspect.ismethod(fn)):
            pending.append((k, name, fn))
        else:
            where = "thread" if inspect.ismethod(fn) else isolation
            try:
                value = call("tool", fn, timeout=timeout, isolation=where, context=context,
                             via=lambda f, arguments=item["arguments"]: f(**arguments))
                ok = True
            except UserCodeError as err:
                value, ok = err, False
            results[k] = _settle(name, fn, ok, value, on_error)
    if pending:
        settled = settle_all("tool", [(fn, (lambda fn=fn, k=k: fn(**calls[k]["arguments"]))) for k, _, fn in pending],
                             [dict(context or {}) for _ in pending], timeout=timeout)
        for (k, name, fn), (ok, value) in zip(pending, settled):
            results[k] = _settle(name, fn, ok, value, on_error)
    return results
