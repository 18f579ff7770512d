"""Text from outside the project (a model's completion, a dataset's prompt, answer or question type) placed into
markdown so that it renders as the text it is. It goes into a code span, on one line: inside a code span markdown
draws nothing, so no image is fetched, no link or HTML made, whatever the text holds. In a table cell its pipes are
escaped too (a pipe ends a cell even inside a code span). Where a code span would read badly (a title, a line of
prose), `escaped` backslash-escapes each character that can begin markup instead (CommonMark shows an escaped
punctuation character as itself), leaving the rest readable in the raw file."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # shown as \xNN; tab kept, newlines made visible below
MARKUP = re.compile(r"([\\`*_\[\]<>!|&~#])")  # what can start markup mid-line: links, images, HTML, emphasis, cells


def escaped(text: object) -> str:
    """`text` as markdown prose on one line that renders as itself: no image, link, HTML or emphasis."""
    text = str(text).replace("\r\n", "\n").replace("\n", " ").replace("\r", " ")
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return MARKUP.sub(r"\\\1", text)


def code_span(text: object, cell: bool = False, limit: int | None = None) -> str:
    """`text` as one markdown code span; `cell`: for a table cell; `limit`: at most that many characters, cut with ….
    Empty text is shown as (empty)."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    text = text.replace("\r\n", "\n").replace("\n", "\\n").replace("\r", "\\r")
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if not text.strip():
        return "(empty)" if not text else f"`{text}`"  # a code span of spaces keeps them
    if cell:
        text = text.replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    # markdown drops one space at each end when both are there: so text at a backtick, or between spaces, is padded
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
