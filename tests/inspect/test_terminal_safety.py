"""Text from a run or from the user reaches the terminal and the logs without control sequences: a reward's name, a
flag, a completion, a path in an error, a traceback in errors.log."""

from __future__ import annotations

import json
import re

import pytest

from vlm_grpo.cli import main
from vlm_grpo.terminal import printable, safe_streams, safe_text

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: writes the clipboard
TITLE = "\x1b]0;owned\x1b\\"  # OSC 0: sets the window title
ONE_BYTE_CSI = "\x9b2J"  # C1 CSI: clears the screen on some terminals
BIDI = "\u202e"  # right-to-left override
ATTACKS = [CLIPBOARD, TITLE, ONE_BYTE_CSI, BIDI, "\x1b[2J\x1b[H", "a\rb", "\x08\x7f"]
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _clean(text: str, keep_newlines=True) -> bool:
    return not RAW.search(text) and (keep_newlines or "\n" not in text)


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_text_helpers_escape_every_control_character(attack):
    assert _clean(printable(f"x{attack}\ny"), keep_newlines=False) and "\\x1b" in printable("\x1b")
    assert _clean(safe_text(f"x{attack}\ny")) and safe_text("a\n\tb") == "a\n\tb"


def test_completions_shows_names_flags_and_text_without_control_sequences(tmp_path, capsys):
    row = {"step": 1, "process": 0, "sample_index": f"3{TITLE}", "prompt": f"p{BIDI}", "completion": f"c{CLIPBOARD}",
           "reward": 1.0, "rewards": {f"correct{CLIPBOARD}": 1.0, "fmt": f"x{ONE_BYTE_CSI}"}, "advantage": 0.5,
           "flags": [f"hack{TITLE}"]}
    (tmp_path / "completions.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["completions", str(tmp_path), "--prompt", "--by", f"fmt{CLIPBOARD}", "--best", "--width", "400"]) == 0
    out = capsys.readouterr().out
    assert _clean(out) and "correct\\x1b]52;c;ZXZpbA==\\x07=+1.000" in out and "FLAGGED: hack\\x1b]0;owned" in out


def test_an_error_naming_a_hostile_path_prints_no_control_sequence(tmp_path, capsys):
    assert main(["completions", str(tmp_path / f"run{CLIPBOARD}")]) != 0
    err = capsys.readouterr().err
    assert "not found" in err and _clean(err) and "\\x1b]52" in err


def test_any_print_inside_a_command_passes_the_stream_guard(capsys):
    with safe_streams():
        print(f"reward {TITLE} {ONE_BYTE_CSI} progress\r", flush=True)
    out = capsys.readouterr().out
    assert _clean(out.replace("\r", "")) and out.endswith("progress\r\n")


def test_errors_log_quotes_user_data_escaped(tmp_path):
    from vlm_grpo.grpo.run.logs import log_failure

    try:
        raise ValueError(f"reward 'x' raised on completion 2 ('{CLIPBOARD}')")
    except ValueError as err:
        log_failure(tmp_path, err)
    text = (tmp_path / "errors.log").read_text()
    assert _clean(text) and "\\x1b]52" in text
