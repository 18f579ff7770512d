"""Text from a run or from the user, made safe to show: control characters become visible escapes.

A completion, a reward's name, a flag or a file name can hold terminal control sequences (ESC ] 52 writes the
clipboard, ESC ] 0 sets the window title, a CSI moves the cursor over earlier lines) and bidirectional overrides
that reorder what is read. Shown on a terminal or in a log someone `cat`s, such text acts instead of being read.

- `printable(text)`: one field on one line: every control character, newlines included, as its escape (`\\x1b`).
- `safe_text(text)`: text of several lines (a traceback, a log entry): newlines and tabs kept, the rest escaped.
- `safe_streams()`: the CLI's stdout and stderr for the length of a command, each write passed through
  `safe_text` (carriage returns kept for progress bars): whatever a command prints, a warning or a one-line error
  included, reaches the terminal without a control sequence.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Any, Iterator

# C0 (but the caller's kept characters), DEL, C1 (0x9b is a one-byte CSI, 0x9d a one-byte OSC), bidi controls
_CONTROL = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"


def _pattern(keep: str) -> re.Pattern:
    ranges = _CONTROL
    if keep:
        return re.compile(f"(?![{re.escape(keep)}])[{ranges}]")
    return re.compile(f"[{ranges}]")


_ONE_LINE = _pattern("")
_LINES = _pattern("\n\t")
_STREAM = _pattern("\n\t\r")


def _escape(match: re.Match) -> str:
    return ascii(match.group())[1:-1]


def printable(text: Any) -> str:
    """`text` on one line, every control character shown as its escape."""
    return _ONE_LINE.sub(_escape, str(text))


def safe_text(text: Any) -> str:
    """`text` with its lines and tabs kept, every other control character shown as its escape."""
    return _LINES.sub(_escape, str(text))


class SafeStream:
    """A text stream whose writes carry no control sequence (carriage returns, newlines and tabs pass)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(_STREAM.sub(_escape, text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def safe_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr as SafeStreams inside the block, given back after."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, SafeStream) else SafeStream(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
