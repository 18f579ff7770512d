"""How tools, tool calls and tool results look to the model.

A chat template with tool support (it renders a user -> assistant with `tool_calls` -> tool exchange, every part of
it) gets the tools as `apply_chat_template(tools=...)` and renders tool turns itself; calls are parsed with the
tokenizer's `response_template` (transformers' `parse_response`) when it has one. Every other template gets the
default format, written into the conversation before the template renders it:
- the tools: a system message (or the conversation's own, extended) holding each tool's JSON schema (transformers'
  `get_json_schema` of the typed, Google-style-docstring function) between <tools></tools>, and how to call one;
- a call: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the assistant's turn (several allowed);
- the results: one user turn, each result between <tool_response></tool_response>, images as image parts.
Calls are parsed with transformers' `parse_response` and the default format's response template.
A tool turn's text is what the template writes between the model's end-of-turn token and the next assistant
header: the rendering of [user, assistant, tool turns] less that of [user, assistant], cut after its last EOS.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
DEFAULT_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. The functions are described "
    "in JSON between <tools></tools>:\n<tools>\n{schemas}\n</tools>\n\nTo call a function, write a JSON object with "
    "its name and arguments between <tool_call></tool_call>:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class ToolFormatError(ValueError):
    """A chat template that cannot render tool turns the way the loop needs them."""


def tool_schema(tool: Callable | dict) -> dict:
    """A tool's JSON schema: transformers' `get_json_schema` of a typed function with a Google-style docstring."""
    if isinstance(tool, dict):
        return tool
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(tool)
    except Exception as err:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        name = getattr(tool, "__name__", repr(tool))
        raise ToolFormatError(f"tool {name!r}: {err} (a tool is a typed function with a Google-style docstring "
                              "describing every argument, as TRL requires)") from None


def default_response_template(end_texts: list[str]) -> dict:
    """transformers' response template for the default format: JSON calls between <tool_call> tags."""
    close = "|".join(re.escape(t) + r"\s*" for t in end_texts if t) + r"|\Z"
    return {
        "start_anchor_pattern": r"\A",  # the default format pre-writes nothing of the assistant's turn
        "defaults": {"role": "assistant"},
        "fields": {
            "tool_calls": {"open": CALL_OPEN, "close_pattern": re.escape(CALL_CLOSE) + r"\s*", "repeats": True,
                           "content": "json", "transform": {"type": "function", "function": "{content}"}},
            "content": {"close_pattern": close, "content": "text"},
        },
    }


@dataclass
class ParsedTurn:
    message: dict[str, Any]  # the assistant message as TRL hands it on: role, content, tool_calls when any
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": str, "arguments": dict} each
    malformed: int = 0  # calls that could not be read (the turn then ends the completion)


def _valid_call(call: Any) -> dict[str, Any] | None:
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        arguments = function.get("arguments")
        arguments = {} if arguments is None else arguments
        if isinstance(arguments, str):  # some formats write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if isinstance(arguments, dict):
            return {"name": function["name"], "arguments": arguments}
    return None


def _image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


class ChatFormat:
    """The tool format of one model's chat template (native or default), probed once."""

    def __init__(self, adapter):
        self.processor, self.tokenizer = adapter.processor, adapter.tokenizer
        self.end_texts = [self.tokenizer.convert_ids_to_tokens(i) for i in adapter.eos_token_ids]
        self.native = self._renders_tool_exchange()
        own = getattr(self.tokenizer, "response_template", None)
        self.response_template = own if self.native and own is not None else default_response_template(self.end_texts)
        self.parses_with_prefix = self.native and own is not None
        self._heads: dict[str | None, tuple[list[dict], str, int]] = {}  # tool name -> tool_turn's rendered head

    # ---------------------------------------------------------------- probing the template
    def _render(self, messages: list[dict], **options) -> str:
        return self.processor.apply_chat_template(messages, tokenize=False, **options)

    def _renders_tool_exchange(self) -> bool:
        """Whether the template renders every part of user -> assistant(tool_calls) -> tool (as TRL checks)."""
        name, key, value, result = "probe_tool_a8f3", "probe_key_b9d4", "probe_val_d6e7", "probe_result_c4f9"
        call = {"type": "function", "function": {"name": name, "arguments": {key: value}}}
        for text in (lambda t: [{"type": "text", "text": t}], lambda t: t):  # VLM templates read parts, LMs text
            messages = [{"role": "user", "content": text("hi")},
                        {"role": "assistant", "content": text(""), "tool_calls": [call]},
                        {"role": "tool", "name": name, "content": text(result)}]
            try:
                rendered = self._render(messages)
            except Exception:  # noqa: BLE001 - jinja raises its own errors on roles or parts it refuses
                continue
            if all(s in rendered for s in (name, key, value, result)):
                return True
        return False

    # ---------------------------------------------------------------- prompts
    def prompt(self, conversation: list[dict], tools: list) -> tuple[list[dict], list | None]:
        """(the conversation to render, the tools to hand the template): the default format writes the tools into
        the system message; a native template renders them itself."""
        if not tools:
            return conversation, None
        schemas = [tool_schema(t) for t in tools]
        if self.native:
            return conversation, schemas
        text = DEFAULT_INSTRUCTIONS.format(schemas="\n".join(json.dumps(s, ensure_ascii=False) for s in schemas))
        if conversation and conversation[0].get("role") == "system":
            first, rest = conversation[0], conversation[1:]
            content = first["content"]
            content = (content + "\n\n" + text if isinstance(content, str)
                       else [*content, {"type": "text", "text": "\n\n" + text}])
            return [{**first, "content": content}, *rest], None
        return [{"role": "system", "content": [{"type": "text", "text": text}]}, *conversation], None

    # ---------------------------------------------------------------- tool turns
    def _result_messages(self, results: list[dict]) -> list[dict]:
        if self.native:  # tool messages as TRL builds them; image parts stand for the images passed beside
            return [{"role": "tool", "name": r["name"], "content": [{"type": "image"} if _image_part(p) else p
                                                                     for p in r["content"]]
                     if isinstance(r["content"], list) else r["content"]} for r in results]
        parts: list[dict] = []
        for r in results:
            body = r["content"] if isinstance(r["content"], list) else [{"type": "text", "text": r["content"]}]
            parts += [{"type": "text", "text": RESULT_OPEN + "\n"},
                      *[{"type": "image"} if _image_part(p) else p for p in body],
                      {"type": "text", "text": "\n" + RESULT_CLOSE}]
        return [{"role": "user", "content": parts}]

    def _head(self, name: str | None) -> tuple[list[dict], str, int]:
        """The exchange a tool turn follows (user, then assistant calling `name` on a native template), its rendering
        and where the assistant's turn ends in it: rendered once per tool name, not once per tool turn."""
        if name not in self._heads:
            call = {"type": "function", "function": {"name": name, "arguments": {}}}
            head = [{"role": "user", "content": [{"type": "text", "text": "dummy"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "dummy"}],
                     **({"tool_calls": [call]} if self.native else {})}]
            before = self._render(head)
            ends = [before.rfind(t) + len(t) for t in self.end_texts if t and t in before]
            self._heads[name] = (head, before, max(ends) if ends else len(before))
        return self._heads[name]

    def tool_turn(self, results: list[dict]) -> str:
        """The text between the model's end-of-turn token and its next turn, for tool messages `results` (TRL's
        {"role": "tool", "name", "content"}; content a string or parts, image parts standing for their images)."""
        head, before, cut = self._head(results[0]["name"] if self.native else None)
        after = self._render(head + self._result_messages(results), add_generation_prompt=True)
        if not after.startswith(before[:cut]):
            raise ToolFormatError("the chat template renders the earlier turns differently once a tool turn follows; "
                                  "multi-turn rollouts need a prefix-preserving template")
        return after[cut:]

    # ---------------------------------------------------------------- the model's turns
    def parse(self, turn_ids: list[int], prefix_ids: list[int], tools: list) -> ParsedTurn:
        """The model's turn (its tokens, end-of-turn token included) as an assistant message and its tool calls."""
        text = self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        plain = self.tokenizer.decode(turn_ids, skip_special_tokens=True)
        try:  # the tokenizer's own template reads its special tokens; the default format reads the text (as one
            # turn's completions are: no special tokens in the messages rewards get)
            parsed = self.tokenizer.parse_response(turn_ids if self.parses_with_prefix else plain,
                                                   schema=self.response_template,
                                                   prefix=prefix_ids if self.parses_with_prefix else "",
                                                   tools=[t for t in tools if callable(t)] or None)
        except (ValueError, TypeError, KeyError):
            parsed = None
        if not isinstance(parsed, dict):  # unreadable: counted, and the completion ends here (as text)
            return ParsedTurn({"role": "assistant", "content": plain}, malformed=max(1, text.count(CALL_OPEN)))
        message = {"role": "assistant", "content": parsed.get("content") or ""}
        raw = parsed.get("tool_calls") or []
        calls = [c for c in (_valid_call(c) for c in raw) if c is not None]
        malformed = len(raw) - len(calls)
        if CALL_OPEN in text and not raw and not self.parses_with_prefix:
            malformed = text.count(CALL_OPEN)  # an opened call the parser did not read as one
        if calls:
            message["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        return ParsedTurn(message, calls=calls if not malformed else [], malformed=malformed)
