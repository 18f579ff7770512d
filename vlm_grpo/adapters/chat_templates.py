"""Chat templates of the tiny twins, built rather than pasted.

ChatML (`<|im_start|>role\\n ... <|im_end|>\\n` per message): Qwen2.5-VL, the LLaVA hybrids and InternVL share
this layout and differ only in what an image part becomes (each processor expands its own placeholder),
whether a default system turn opens the conversation, and InternVL's video part. One builder keeps them from
drifting apart. `user_assistant_template`: the Idefics3/SmolVLM `User:`/`Assistant:` layout.
`chatml_default_system`: the default system turn a real LM's ChatML template writes (compose keeps it).
"""

from __future__ import annotations

DEFAULT_SYSTEM = "You are a helpful assistant."


def _quoted(text: str) -> str:
    """`text` as a single-quoted Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def chatml_template(
    image_part: str, default_system: str | None = DEFAULT_SYSTEM, video_part: str | None = None
) -> str:
    """A ChatML template writing `image_part` per image part; `default_system` opens a conversation
    that has no system message of its own (None: no default turn); `video_part`, when given, per video part."""
    system = ""
    if default_system is not None:
        system = (
            "{%- if loop.first and message['role'] != 'system' -%}"
            "{{- " + _quoted(f"<|im_start|>system\n{default_system}<|im_end|>\n") + " -}}"
            "{%- endif -%}"
        )
    video = ""
    if video_part is not None:
        video = "{%- elif part['type'] == 'video' -%}{{- " + _quoted(video_part) + " -}}"
    return (
        "{%- for message in messages -%}"
        + system
        + "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}{{- message['content'] -}}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}{{- " + _quoted(image_part) + " -}}"
        + video
        + "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


def user_assistant_template(prefix: str) -> str:
    """The Idefics3/SmolVLM format: `<prefix>User:<image>text<end_of_utterance>\\nAssistant:` (a video part is `<video>`,
    which SmolVLM's processor expands into timestamped frames).

    `prefix` opens the whole conversation once (SmolVLM: <|im_start|>, Idefics3-8B: <|begin_of_text|>).
    A role is followed by ':' when its first part is an image and ': ' otherwise.
    """
    return (
        "{{- " + _quoted(prefix) + " -}}"
        "{%- for message in messages -%}"
        "{{- message['role'] | capitalize -}}"
        "{%- if message['content'] is string -%}{{- ': ' + message['content'] -}}"
        "{%- else -%}"
        "{%- if message['content'][0]['type'] == 'image' -%}{{- ':' -}}{%- else -%}{{- ': ' -}}{%- endif -%}"
        "{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}{{- '<image>' -}}"
        "{%- elif part['type'] == 'video' -%}{{- '<video>' -}}"
        "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{- '<end_of_utterance>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
    )


_PROBE = [{"role": "user", "content": "Hello"}]
_PROBE_TURNS = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


class NotChatML(ValueError):
    """A tokenizer's chat template does not write ChatML turns."""


def chatml_default_system(tokenizer) -> str | None:
    """The system message `tokenizer`'s ChatML template opens a conversation without one with (None: no system
    turn), read off one rendering rather than the template's source. NotChatML when it renders anything else."""
    if not getattr(tokenizer, "chat_template", None):
        raise NotChatML("the tokenizer has no chat template")
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja raises its own errors (and templates raise_exception) on what they refuse
        raise NotChatML(f"its chat template cannot render a plain user turn ({type(err).__name__}: {err})") from None
    if text == _PROBE_TURNS:
        return None
    head, tail = "<|im_start|>system\n", "<|im_end|>\n" + _PROBE_TURNS
    if isinstance(text, str) and text.startswith(head) and text.endswith(tail):
        system = text[len(head) : len(text) - len(tail)]
        if "<|im_" not in system:
            return system
    raise NotChatML(f"its chat template renders a user turn as {text!r}")
