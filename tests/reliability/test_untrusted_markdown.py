"""Text a model wrote or a dataset holds, placed into markdown the project writes (the experiment's summary.md, the
completions table trackers show), renders as that text: no image fetched, no link, no HTML, no table cell broken.
Checked by rendering with markdown-it (CommonMark with tables), not by reading our own output back."""

from __future__ import annotations

import html
import re

import pytest
from markdown_it import MarkdownIt

from tests.grpo.test_experiment_table import rows
from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.experiment.table import markdown, split_table
from vlm_grpo.grpo.run.completion_tables import _markdown as completions_markdown
from vlm_grpo.markdown_text import code_span, escaped

HOSTILE = [
    "![pixel](https://example.com/track.png)",
    '<img src="https://example.com/x.png" onerror="alert(1)">',
    "[click](javascript:alert(1)) and <https://example.com>",
    "a | b || c",
    "`a` ``b`` ```c",
    "`starts and ends with a backtick`",
    "  spaced  ",
    "line one\nline two\r\n| --- |\n# heading",
    "tab\there, bell\x07, escape\x1b[31m",
    "<script>alert(1)</script>",
    "\\| a backslash before a pipe \\\\| and two",
]
RENDER = MarkdownIt("commonmark").enable("table")


def shown(text: str) -> str:
    """What a reader sees of `text`: its lines joined with a visible \\n, control characters as \\xNN."""
    text = text.replace("\r\n", "\n").replace("\n", "\\n")
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)


def no_markup_from_text(rendered: str) -> None:
    for tag in ("<img", "<a ", "<script", "<h1>heading", "<b>"):
        assert tag not in rendered, rendered


@pytest.mark.parametrize("text", HOSTILE)
def test_a_code_span_renders_the_text_itself_in_a_paragraph_and_a_table_cell(text):
    paragraph = RENDER.render(f"said: {code_span(text)}")
    no_markup_from_text(paragraph)
    codes = re.findall(r"<code>(.*?)</code>", paragraph, re.S)
    assert [html.unescape(c) for c in codes] == [shown(text)]
    table = RENDER.render(f"| model | answer | share |\n| --- | --- | --- |\n| grpo | {code_span(text, cell=True)} | 9 |\n")
    no_markup_from_text(table)
    cells = re.findall(r"<td>(.*?)</td>", table, re.S)
    assert len(cells) == 3 and cells[0] == "grpo" and cells[2] == "9", table
    assert html.unescape(re.fullmatch(r"<code>(.*)</code>", cells[1], re.S).group(1)) == shown(text)


def test_empty_and_long_text():
    assert code_span("") == "(empty)"
    cut = code_span("x" * 50, limit=10)
    assert cut == "`" + "x" * 9 + "…`"


def test_the_experiment_summary_shows_hostile_answers_prompts_and_types_as_text(tmp_path):
    exp = Experiment(source="x.yaml", name="x", output_dir=tmp_path, base_seed=0, compose={}, stages={},
                     eval={"splits": ["val"]})
    answers, types = HOSTILE[:6], ["t|1", "t|1", "<b>t2</b>", "<b>t2</b>", "![t](http://e/t.png)", "t|1"]
    by = {m: rows([1, 0, 1, 0, 1, 0], [0] * 6, HOSTILE[5:11], answers, types) for m in ("base", "sft", "grpo")}
    table = split_table(exp, [0], "val", {(0, m): r for m, r in by.items()})
    changed = [{"seed": 0, "split": "val", "index": k, "prompt": HOSTILE[k], "sft": HOSTILE[k + 1], "sft_correct": False,
                "grpo": HOSTILE[k + 2], "grpo_correct": True} for k in range(len(HOSTILE) - 2)]
    summary = {"experiment": "x", "config": "x.yaml", "written": "2026-11-28",
               "versions": {"commit": "abc", "torch": "2", "transformers": "5"}, "seeds": [0],
               "independent_seeds": True, "splits": {"val": table}, "times": {0: {"sft": 1.0}},
               "monitor": {0: {"grpo": {w: {"steps": [1, 10], "all": 0.5, "by_type": {"t|1": 0.9},
                                        "right": {"all": 0.4, "by_type": {"t|1": 0.6}}} for w in ("first", "middle", "last")}}},
               "changed": changed}
    text = markdown(summary)
    rendered = RENDER.render(text)
    no_markup_from_text(rendered)
    header_cells = {}
    for table_html in re.findall(r"<table>.*?</table>", rendered, re.S):
        heads = len(re.findall(r"<th>", table_html))
        for row in re.findall(r"<tr>(.*?)</tr>", table_html.split("</thead>")[1], re.S):
            assert len(re.findall(r"<td>", row)) == heads, row
        header_cells[heads] = True
    assert {7, 6}.issubset(header_cells)  # the models' and the differences' tables were both there
    codes = {html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", rendered, re.S)}
    assert {shown(t) for t in HOSTILE} <= codes  # every prompt and completion shown whole, as written
    assert {"t|1", "<b>t2</b>", "![t](http://e/t.png)"} <= codes


def test_the_completions_table_shows_hostile_completions_as_text():
    data = [[0, text, HOSTILE[0], 1.5, None] for text in HOSTILE]
    rendered = RENDER.render(completions_markdown(["step", "prompt", "completion", "reward", "note"], data))
    no_markup_from_text(rendered)
    body = rendered.split("</thead>")[1]
    found = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    assert len(found) == len(HOSTILE)
    for row, text in zip(found, HOSTILE):
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        assert len(cells) == 5 and cells[3] == "1.5" and cells[4] == ""
        assert html.unescape(re.fullmatch(r"<code>(.*)</code>", cells[1], re.S).group(1)) == shown(text)


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_prose_renders_the_text_itself(text):
    rendered = RENDER.render(f"said: {escaped(text)}")
    no_markup_from_text(rendered)
    seen = html.unescape(re.fullmatch(r"<p>said: (.*)</p>\n", rendered, re.S).group(1))
    assert seen == shown(text).replace("\\n", " ").rstrip()  # a line end shown as a space, trailing spaces dropped


def test_reward_names_in_the_completions_tables_header_render_as_text():
    names = [f"reward/{text}" for text in HOSTILE]
    rendered = RENDER.render(completions_markdown(["step", *names], [[1, *range(len(names))]]))
    no_markup_from_text(rendered)
    heads = re.findall(r"<th>(.*?)</th>", rendered, re.S)
    assert len(heads) == 1 + len(names)  # no header cell split by a pipe in a name
    assert [html.unescape(h) for h in heads[1:]] == [shown(n).replace("\\n", " ").rstrip() for n in names]


def test_the_model_card_shows_names_titles_and_paths_from_settings_as_text():
    from types import SimpleNamespace

    from vlm_grpo.grpo.run.model_card import model_card
    from vlm_grpo.grpo.settings.sources import load_config

    cfg = load_config(None, ["--max-steps", "2", "--eval.split", HOSTILE[0]])
    rewards = [SimpleNamespace(name=text, weight=1.0) for text in HOSTILE]
    report = {"size": 2, "accuracy": 0.5, "reward": 1.0, "completion_length": 3.0,
              "rewards": {text: 0.5 for text in HOSTILE}}
    card = model_card(cfg, stage="grpo", family="qwen2_5_vl", rewards=rewards, heldout={"end": report},
                      title=HOSTILE[1], lora=False)
    rendered = RENDER.render(str(card).split("\n---\n", 1)[1])
    no_markup_from_text(rendered)
    assert "<h1>&lt;img src=" in rendered  # the title, as written
    held = [t for t in re.findall(r"<table>.*?</table>", rendered, re.S) if "accuracy" in t][0]
    assert len(re.findall(r"<th>", held)) == 4 + len(HOSTILE)  # one column per reward, none split by its name
