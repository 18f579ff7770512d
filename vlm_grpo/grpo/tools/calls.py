"""Running the model's tool calls, as TRL 1.16 runs them, plus a time limit.

A call runs `function(**arguments)`; an async function is awaited on a private event loop (a daemon thread, as
TRL's). A call that raises, names no known tool, or does not return within the time limit sends its error back to
the model as the result (`{"error": "..."}`) and counts as failed. What a tool may return:
- text: a str, a number, None, or a JSON-able dict / list (written as JSON);
- an image: a PIL image;
- both: a list of content parts (`{"type": "text", "text": ...}`, `{"type": "image", "image": <PIL>}`, bare strings
  and PIL images allowed), TRL's multimodal tool response.
Anything else (bytes, arrays, tensors, objects) is a ToolResultError naming the tool: a bug in the tool, not a move
of the model, so it stops the run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from PIL import Image

from vlm_grpo.grpo import async_loop



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


def _run_sync(fn: Callable, arguments: dict, timeout: float | None) -> Any:
    if not timeout:
        return fn(**arguments)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(**arguments)
        except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = err

    # A daemon thread: a tool that never returns is abandoned, and cannot keep the process alive at exit.
    worker = threading.Thread(target=target, name="vlm-grpo-tool-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"no result within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _run_async(fn: Callable, arguments: dict, timeout: float | None) -> Any:
    if not timeout:
        return await fn(**arguments)
    try:
        return await asyncio.wait_for(fn(**arguments), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no result within {timeout:g} s") from None


def _failure(name: str, err: BaseException) -> ToolResult:
    content, _ = tool_content(name, {"error": str(err) or type(err).__name__})
    return ToolResult(name, content, failed=True, timed_out=isinstance(err, TimeoutError))


def _result(name: str, value: Any) -> ToolResult:
    content, images = tool_content(name, value)
    return ToolResult(name, content, images=images)


def run_calls(calls: list[dict[str, Any]], functions: dict[str, Callable], timeout: float | None) -> list[ToolResult]:
    """The results of one turn's calls ({"name", "arguments"} each), in call order; async ones run concurrently."""
    results: list[ToolResult | None] = [None] * len(calls)
    pending = []
    for k, call in enumerate(calls):
        name, fn = call["name"], functions.get(call["name"])
        if fn is None:
            results[k] = _failure(name, ValueError(f"Tool {name} not found."))
        elif inspect.iscoroutinefunction(fn):
            pending.append((k, name, _run_async(fn, call["arguments"], timeout)))
        else:
            try:
                value = _run_sync(fn, call["arguments"], timeout)
            except Exception as err:  # noqa: BLE001 - the model's call failed: it learns from the error
                results[k] = _failure(name, err)
            else:
                results[k] = _result(name, value)
    if pending:
        async def gather():
            return await asyncio.gather(*(coro for _, _, coro in pending), return_exceptions=True)

        values = async_loop.run(gather())
        for (k, name, _), value in zip(pending, values):
            results[k] = _failure(name, value) if isinstance(value, Exception) else _result(name, value)
    return results
