"""`clevr_count`: CLEVR object counting with R1-style reasoning, as in the "LLM learns to see" recipe.

Two row shapes, one recipe:
- SFT rows `(image, problem, thinking, solution)` (the Clevr_CoGenT_TrainA_R1 layout): the sample's
  `reference` is `<think>{thinking}</think>\\n<answer>{solution}</answer>` for a supervised warm-up.
- GRPO rows `(image, problem, solution)` (the Clevr_CoGenT_TrainA_70K_Complex layout): no reference.
`thinking` and `solution` may already carry their `<think>`/`<answer>` tags (the hub sets do); they are
stripped before use. Rows come from a local JSONL/JSON/parquet file or folder, or a hub id.

Rewards, with the post's values:
- format (0.5): the whole reply is `<think>...</think>\\n<answer>...</answer>` (one newline between).
- correctness (2.0): the text inside the reply's last `<answer>` tag, trimmed, equals the solution.
The values are the rewards themselves (weights stay 1.0), so logged components read as in the post.
"""

from __future__ import annotations

import re
from typing import Any

from vlm_grpo.recipes.audit_hints import AuditHints, inline_think_layout
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.file_recipe import read_samples, with_source_options
from vlm_grpo.recipes.rewards import tags_filled
from vlm_grpo.recipes.rows import RecordDataset, RowChecker

SYSTEM_PROMPT = (
    "You answer questions about an image. Reason about it first, then give the final answer, using exactly "
    "this layout:\n<think>\nyour reasoning\n</think>\n<answer>\nthe final answer\n</answer>"
)
STRICT_FORMAT = re.compile(r"<think>[\s\S]*?</think>\n<answer>[\s\S]*?</answer>")
FORMAT_REWARD, CORRECT_REWARD = 0.5, 2.0


def strip_tag(text: str, tag: str) -> str:
    """'<answer> 3 </answer>' -> '3'; text without the tag is only trimmed."""
    match = re.fullmatch(rf"\s*<{tag}>(.*?)</{tag}>\s*", text, flags=re.DOTALL)
    return (match.group(1) if match else text).strip()


def extract_answer(text: str) -> str:
    """What follows the last `<answer>`, up to `</answer>` if it is closed, trimmed (the whole text
    when there is no answer tag)."""
    _, found, tail = text.rpartition("<answer>")
    if not found:
        return text.strip()
    return tail.partition("</answer>")[0].strip()


def check_row(checker: RowChecker, index: int, row: dict, require_thinking: bool = False) -> dict:
    record = {
        "image": checker.image(index, row, ("image",)),
        "problem": checker.text(index, row, "problem").strip(),
        "solution": strip_tag(checker.text(index, row, "solution"), "answer"),
        "thinking": checker.text(index, row, "thinking", required=require_thinking),
    }
    if not record["solution"]:
        raise checker.fail(index, "solution", "has an empty <answer>")
    if record["thinking"] is not None:
        record["thinking"] = strip_tag(record["thinking"], "think")
    return record


def strict_format(completions: list[str], **_) -> list[float]:
    """0.5 when the whole reply is <think>...</think>, one newline, <answer>...</answer>, both blocks filled (the
    reward audit found empty tags paid in full)."""
    return [FORMAT_REWARD if STRICT_FORMAT.fullmatch(t) and tags_filled(t, "think", "answer") else 0.0
            for t in completions]


def correctness(completions: list[str], answer: list[str], **_) -> list[float]:
    """2.0 when the reply's answer equals the solution (both trimmed)."""
    return [CORRECT_REWARD if extract_answer(t) == str(a).strip() else 0.0 for t, a in zip(completions, answer)]


def to_sample(record: dict, image_size: int | None) -> Sample:
    reference = None
    if record["thinking"] is not None:
        reference = f"<think>{record['thinking']}</think>\n<answer>{record['solution']}</answer>"
    return Sample(
        prompt=[{"role": "system", "content": SYSTEM_PROMPT}, *user_turn(record["problem"])],
        images=[record["image"].load(image_size)],
        fields={"answer": record["solution"]},
        reference=reference,
    )


@with_source_options
def build(require_thinking: bool = False, **source: Any) -> RecordDataset:
    """The first `size` rows (all when 0/None; recipes/file_recipe.py: the options); `require_thinking=True` insists
    on SFT rows."""
    return read_samples(lambda c, i, r: check_row(c, i, r, require_thinking), to_sample, **source)


RECIPE = Recipe(
    name="clevr_count",
    build=build,
    rewards=[Reward("format", strict_format), Reward("correctness", correctness)],
    accuracy_reward="correctness",
    checks_rows=True,
    audit=AuditHints(layout=inline_think_layout),
)
