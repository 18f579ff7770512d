"""`vsr`: Visual Spatial Reasoning as the VSR-GRPO study trains it — is a spatial caption true of the image?

Rows follow the study's prepared set: `image_path` (or `image`), `caption`, `label` (1/0, true/false),
`relation`, `subj`, `obj`. They come from a local JSONL/JSON/parquet file, a folder holding one (image
paths resolve against the folder and its `images/` subfolder, or `image_root`), or a hub dataset id read
with `datasets.load_dataset` (e.g. a VSR export whose `image` column holds file names: pass `image_root`).

The prompt is the study's question, "Is the following statement true: <caption>", followed by the
R1-style instruction to think in <think> </think> and answer in <answer> </answer>; the solution is
"True" or "False". Rewards (the study's pair):
- accuracy: 1.0 when the answer (the <answer> content, or the whole reply without one) is the right
  truth value. "yes"/"no" count as "true"/"false": the study relaxed its evaluation this way because
  its small VLM kept answering Yes/No.
- format: 1.0 when the reply is exactly `<think>...</think>` then `<answer>...</answer>` (whitespace between).
"""

from __future__ import annotations

import re
from typing import Any

from vlm_grpo.recipes.audit_hints import AuditHints, inline_think_layout
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.file_recipe import read_samples, with_source_options
from vlm_grpo.recipes.rows import RecordDataset, RowChecker
from vlm_grpo.recipes.rewards import answer_or_text, tags_filled

QUESTION = "Is the following statement true: {caption}"
INSTRUCTION = (
    " First output the thinking process in <think> </think> tags and then output the final answer "
    "(True or False) in <answer> </answer> tags."
)
FORMAT_PATTERN = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
TRUTH_WORDS = {"true": True, "yes": True, "false": False, "no": False}
LABEL_VALUES = {1: True, 0: False, "1": True, "0": False, "true": True, "false": False, "yes": True, "no": False}


def _label(checker: RowChecker, index: int, row: dict) -> bool:
    if "label" not in row or row["label"] is None:
        raise checker.fail(index, "label", "is missing")
    value = row["label"]
    if isinstance(value, bool):
        return value
    key = value.strip().lower() if isinstance(value, str) else value
    if isinstance(key, (int, float, str)) and key in LABEL_VALUES:
        return LABEL_VALUES[key]
    raise checker.fail(index, "label", f"must be 1/0 or true/false, got {value!r}")


def check_row(checker: RowChecker, index: int, row: dict) -> dict:
    record = {
        "image": checker.image(index, row, ("image_path", "image")),
        "caption": checker.text(index, row, "caption").strip(),
        "label": _label(checker, index, row),
    }
    for name in ("relation", "subj", "obj"):  # descriptive; kept for per-relation metrics when present
        record[name] = checker.text(index, row, name, required=False)
    return record


def parse_truth(text: str) -> bool | None:
    """True/False from a reply's answer ('True', 'yes.', ' FALSE '), None when it is neither."""
    word = answer_or_text(text).strip().strip(".!").strip().lower()
    return TRUTH_WORDS.get(word)


def accuracy(completions: list[str], solution: list[str], **_) -> list[float]:
    """1.0 when the answer is the right truth value (True/False, or Yes/No)."""
    return [1.0 if parse_truth(t) is (sol == "True") else 0.0 for t, sol in zip(completions, solution)]


def format_reward(completions: list[str], **_) -> list[float]:
    """1.0 for `<think>...</think>` followed by `<answer>...</answer>` and nothing else, both blocks filled (the
    reward audit found empty tags paid in full)."""
    return [1.0 if FORMAT_PATTERN.fullmatch(t.strip()) and tags_filled(t, "think", "answer") else 0.0
            for t in completions]


def to_sample(record: dict, image_size: int | None) -> Sample:
    return Sample(
        prompt=user_turn(QUESTION.format(caption=record["caption"]) + INSTRUCTION),
        images=[record["image"].load(image_size)],
        fields={
            "solution": "True" if record["label"] else "False",
            "relation": record["relation"],
            "caption": record["caption"],
        },
    )


@with_source_options
def build(**source: Any) -> RecordDataset:
    """The first `size` rows of the split (all when 0/None), in the file's order (recipes/file_recipe.py: the options)."""
    return read_samples(check_row, to_sample, **source)


RECIPE = Recipe(
    name="vsr",
    build=build,
    rewards=[Reward("accuracy", accuracy), Reward("format", format_reward)],
    accuracy_reward="accuracy",
    checks_rows=True,
    audit=AuditHints(layout=inline_think_layout,
                     candidates=lambda sample, answer: ["True", "False"]),
)
