"""`vlm-grpo completions`: ordering, step filter and a terminal-safe rendering."""

from __future__ import annotations

import json

import pytest

from vlm_grpo.cli import main
from vlm_grpo.inspect.completions import format_rows, load_completions, printable, select


@pytest.fixture
def run_dir(tmp_path):
    rows = []
    for step in (1, 2, 3):
        for k, reward in enumerate((0.5, 2.0, -1.0, 1.0)):
            rows.append({
                "step": step, "process": 0, "sample_index": 10 * step + k, "prompt": "How many?",
                "completion": f"s{step}k{k} answer {reward}", "reward": reward + step,
                "rewards": {"correctness": float(reward > 0), "format": reward}, "advantage": reward - 0.6,
            })
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_select_orders_and_filters(run_dir):
    rows = load_completions(run_dir)
    assert [r["reward"] for r in select(rows, step=2, order="best")] == [4.0, 3.0, 2.5, 1.0]
    assert [r["reward"] for r in select(rows, step=2, order="worst", limit=2)] == [1.0, 2.5]
    assert {r["step"] for r in select(rows, step=-1)} == {3}  # -1: the last logged step
    assert select(rows, step=9) == []
    best_all = select(rows, order="best", limit=1)[0]
    assert best_all["step"] == 3 and best_all["reward"] == 5.0
    by_adv = select(rows, step=1, order="worst", sort_key="advantage")
    assert by_adv[0]["advantage"] == pytest.approx(-1.6)
    by_component = select(rows, step=1, order="best", sort_key="format")
    assert by_component[0]["rewards"]["format"] == 2.0
    assert [r["sample_index"] for r in select(rows, step=1)] == [10, 11, 12, 13]  # log order kept


def test_cli_worst_and_best(run_dir, capsys):
    assert main(["completions", str(run_dir), "--worst", "--step", "2", "--limit", "2", "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert out.index("s2k2") < out.index("s2k0")  # -1.0 before 0.5
    assert "s2k1" not in out and "s1k" not in out and "s3k" not in out
    assert "correctness=" in out and "adv " in out and "format=" in out
    assert all(len(line) <= 80 for line in out.splitlines()[1:])
    assert main(["completions", str(run_dir), "--best", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "s3k1" in out and "s2k1" not in out


def test_best_and_worst_are_exclusive(run_dir):
    with pytest.raises(SystemExit):
        main(["completions", str(run_dir), "--best", "--worst"])


def test_rendering_is_terminal_safe_and_width_aware():
    text = "line one\nline\ttwo \x1b[31mred\x00" + " word" * 60
    row = {"step": 1, "sample_index": 0, "reward": 1.0, "advantage": 0.5, "rewards": {"a": 1.0}, "completion": text}
    out = format_rows([row], width=50, max_lines=3)
    assert "\x1b" not in out and "\x00" not in out and "\\x1b" in out
    assert all(len(line) <= 50 for line in out.splitlines())
    assert "more lines" in out
    assert printable("a\nb") == "a⏎ b"
