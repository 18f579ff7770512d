"""`mm_math`: multimodal maths (geometry, charts, ...) as in the TRL VLM-GRPO walkthrough.

Rows follow lmms-lab/multimodal-open-r1-8k-verified: `image`, `problem`, `solution` (other columns such as
`original_question`/`original_answer` are ignored). They come from a local JSONL/JSON/parquet file or folder
(including the hub's `data/train-*.parquet` layout) or a hub id. A system turn asks for reasoning in
<think> </think> and the answer in <answer> </answer>; the user turn is the image and the problem.

Rewards (the walkthrough's pair, 1.0 each):
- format: the reply is `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>` — matched from the start, with
  `$` allowed at any line end (the walkthrough's `re.match` with DOTALL|MULTILINE).
- accuracy: the reference answer is the `<answer>` content of `solution` when it has one, else the whole
  solution. When `math_verify.parse` finds mathematics in it, the reply's answer (its `<answer>` content,
  else the whole reply) is parsed too and `math_verify.verify` decides equivalence, so `\\frac{1}{2}`,
  `0.5` and `\\boxed{\\frac{2}{4}}` all match; a verifier error scores 0. Otherwise (multiple-choice
  letters, words) it is a normalized string match: lower-case, whitespace squashed, surrounding `$`,
  `\\boxed{}` and a trailing full stop dropped.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from vlm_grpo.recipes.audit_hints import AuditHints
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.file_recipe import read_samples, with_source_options
from vlm_grpo.recipes.rows import RecordDataset, RowChecker
from vlm_grpo.recipes.rewards import answer_or_text, normalize_answer, tags_filled

SYSTEM_PROMPT = (
    "The user asks a question about an image and the assistant solves it. The assistant first reasons "
    "through the problem and then gives the answer. The reasoning goes inside <think> </think> tags and the "
    "answer inside <answer> </answer> tags, each tag on its own line:\n"
    "<think>\nreasoning here\n</think>\n<answer>\nanswer here\n</answer>"
)
FORMAT_PATTERN = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)


def _math_verify():
    try:
        import math_verify
        from latex2sympy2_extended import NormalizationConfig
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the mm_math recipe needs math-verify: pip install math-verify") from err
    return math_verify, NormalizationConfig


def _timeout() -> int | None:
    """math-verify times out with signal.alarm, which only the main thread may use; elsewhere, none."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _with_math_delimiters(parse, text: str) -> list:
    """math-verify misses bare nested LaTeX (`\\frac{\\sqrt{3}}{2}` without `$`); an answer is all maths,
    so when nothing is found the text is tried again inside `$...$`."""
    found = parse(text)
    if not found and "$" not in text and "\\" in text:
        found = parse(f"${text}$")
    return found


def parse_gold(solution: str) -> list:
    math_verify, _ = _math_verify()

    def parse(text: str) -> list:
        return math_verify.parse(text, extraction_mode="first_match", parsing_timeout=_timeout())

    try:
        return _with_math_delimiters(parse, solution)
    except Exception:  # noqa: BLE001 - an unparsable reference is compared as a string
        return []


def parse_reply(answer: str) -> list:
    math_verify, NormalizationConfig = _math_verify()
    latex = math_verify.LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False, malformed_operators=False, basic_latex=True, boxed="all", units=True
        ),
        boxed_match_priority=0,
    )

    def parse(text: str) -> list:
        return math_verify.parse(
            text,
            extraction_config=[latex, math_verify.ExprExtractionConfig()],
            extraction_mode="first_match",
            parsing_timeout=_timeout(),
        )

    return _with_math_delimiters(parse, answer)


def is_correct(reply: str, solution: str) -> bool:
    gold_text = answer_or_text(solution)
    given = answer_or_text(reply)
    gold = parse_gold(gold_text)
    if gold:
        math_verify, _ = _math_verify()
        try:
            return bool(math_verify.verify(gold, parse_reply(given), timeout_seconds=_timeout()))
        except Exception:  # noqa: BLE001 - the walkthrough skips such replies; here they score 0
            return False
    return normalize_answer(given) == normalize_answer(gold_text)


def accuracy(completions: list[str], solution: list[str], **_) -> list[float]:
    """1.0 when the reply's answer is mathematically (or, for non-maths answers, textually) the solution."""
    return [1.0 if is_correct(t, s) else 0.0 for t, s in zip(completions, solution)]


def format_reward(completions: list[str], **_) -> list[float]:
    """1.0 for <think>, newline-delimited reasoning, </think>, then <answer> likewise, both blocks filled (the
    reward audit found empty tags paid in full)."""
    return [1.0 if FORMAT_PATTERN.match(t) and tags_filled(t, "think", "answer") else 0.0 for t in completions]


def check_row(checker: RowChecker, index: int, row: dict) -> dict:
    record = {
        "image": checker.image(index, row, ("image",)),
        "problem": checker.text(index, row, "problem").strip(),
        "solution": checker.text(index, row, "solution").strip(),
    }
    if not answer_or_text(record["solution"]):
        raise checker.fail(index, "solution", "has an empty <answer>")
    return record


def to_sample(record: dict, image_size: int | None) -> Sample:
    return Sample(
        prompt=[{"role": "system", "content": SYSTEM_PROMPT}, *user_turn(record["problem"])],
        images=[record["image"].load(image_size)],
        fields={"solution": record["solution"]},
    )


@with_source_options
def build(**source: Any) -> RecordDataset:
    """The first `size` rows (all when 0/None), in the source's order (recipes/file_recipe.py: the options)."""
    return read_samples(check_row, to_sample, **source)


RECIPE = Recipe(
    name="mm_math",
    build=build,
    rewards=[Reward("format", format_reward), Reward("accuracy", accuracy)],
    accuracy_reward="accuracy",
    checks_rows=True,
    audit=AuditHints(),  # the R1 layout with each tag on its own line is this recipe's format
)
