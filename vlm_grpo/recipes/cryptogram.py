"""`cryptogram`: decode a short message with a substitution-cipher decoder shown only in the image.

Each sample draws a random cipher (a derangement of a-z: no letter stands for itself) and a message of
1 to `max_words` words from the project's word list (`data/words.txt`). The image is the decoder table:
26 cells, each a coded letter, an arrow and the plain letter it stands for. The prompt carries the coded
message with letters space-separated and `_` between words ("i can see" -> "x _ q r m _ z b b"), so a
small model does not have to split tokens into letters. Everything is a function of (seed, split, index).

Three rewards, each on [0, 1]:
- format: 1.0 when `<think>...</think>`, `<chars>...</chars>` and `<answer>...</answer>` appear in that order.
- decoding: similarity of the `<chars>` content to the true characters, where
  similarity = 1 - levenshtein(pred, truth) / max(len(pred), len(truth)), compared after lower-casing and
  dropping whitespace (so "i _ c a n" and "i_can" are the same). Paid only when the prediction is strictly
  closer to the truth (by edit distance) than the coded message is: copying the coded message earns 0.
- correctness: the same similarity for the `<answer>` content against the message (lower-cased, whitespace
  squashed), gated against the coded message written as words, and paid only when decoding got full
  credit, so a late fix cannot make up for a wrong decoding.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from vlm_grpo.recipes.audit_hints import AuditHints
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples
from vlm_grpo.recipes.rewards import edit_distance, similarity, squash_spaces, tag_content, tags_filled

WORDS_FILE = Path(__file__).parent / "data" / "words.txt"
LETTERS = string.ascii_lowercase
COLUMNS, CELL_W, CELL_H, MARGIN = 7, 80, 52, 12
FORMAT_PATTERN = r"<think>.*?</think>.*?<chars>.*?</chars>.*?<answer>.*?</answer>"

PROMPT = (
    "The image is a decoder for a substitution cipher: each cell shows a coded letter, an arrow, and the "
    "letter it stands for. Decode this message (letters are separated by spaces, words by _):\n{coded}\n"
    "Think inside <think> </think>. Then write the decoded letters in order, space-separated with _ between "
    "words, inside <chars> </chars>, and the decoded message inside <answer> </answer>."
)


@lru_cache(maxsize=1)
def word_list() -> tuple[str, ...]:
    words = tuple(w.strip() for w in WORDS_FILE.read_text(encoding="utf-8").splitlines() if w.strip())
    bad = [w for w in words if not set(w) <= set(LETTERS)]
    if bad:
        raise ValueError(f"{WORDS_FILE}: words must be lower-case a-z only: {bad[:5]}")
    return words


def random_cipher(rng: random.Random) -> dict[str, str]:
    """plain letter -> coded letter, a derangement (no fixed letter), so every message changes when coded."""
    while True:
        shuffled = list(LETTERS)
        rng.shuffle(shuffled)
        if all(p != c for p, c in zip(LETTERS, shuffled)):
            return dict(zip(LETTERS, shuffled))


def spell(message: str) -> str:
    """'i can' -> 'i _ c a n'."""
    return " _ ".join(" ".join(word) for word in message.split())


def encode(message: str, cipher: dict[str, str]) -> str:
    return spell("".join(cipher.get(ch, ch) for ch in message))


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow without FreeType: the small bitmap font
        return ImageFont.load_default()


def draw_decoder(cipher: dict[str, str]) -> Image.Image:
    """Cells sorted by coded letter: `coded -> plain`, the arrow drawn as lines (no font glyph needed)."""
    decode = {coded: plain for plain, coded in cipher.items()}
    rows = -(-len(LETTERS) // COLUMNS)
    img = Image.new("RGB", (2 * MARGIN + COLUMNS * CELL_W, 2 * MARGIN + rows * CELL_H), "white")
    draw = ImageDraw.Draw(img)
    font = _font(26)
    for k, coded in enumerate(LETTERS):
        x0 = MARGIN + (k % COLUMNS) * CELL_W
        y0 = MARGIN + (k // COLUMNS) * CELL_H
        draw.rectangle([x0, y0, x0 + CELL_W - 4, y0 + CELL_H - 4], outline="gray")
        mid = y0 + (CELL_H - 4) // 2
        draw.text((x0 + 6, mid), coded, fill="black", font=font, anchor="lm")
        ax0, ax1 = x0 + 32, x0 + 48
        draw.line([(ax0, mid), (ax1, mid)], fill="black", width=2)
        draw.polygon([(ax1 + 4, mid), (ax1 - 2, mid - 5), (ax1 - 2, mid + 5)], fill="black")
        draw.text((x0 + 56, mid), decode[coded], fill="darkblue", font=font, anchor="lm")
    return img


def reference_response(message: str, cipher: dict[str, str]) -> str:
    lookups = ", ".join(f"{cipher[ch]}->{ch}" for ch in dict.fromkeys(message.replace(" ", "")))
    return (
        f"<think>Looking up each coded letter in the decoder: {lookups}.</think>\n"
        f"<chars> {spell(message)} </chars>\n<answer>{message}</answer>"
    )


@dataclass
class CryptogramDataset(GeneratedSamples):
    stream = "cryptogram"
    max_words: int = 3
    image_size: int | None = None  # longest side after resizing (None: as drawn, 584 x 232)

    def draw(self, index: int, rng: random.Random) -> Sample:
        words = word_list()
        message = " ".join(rng.choice(words) for _ in range(rng.randint(1, self.max_words)))
        cipher = random_cipher(rng)
        coded = encode(message, cipher)
        image = draw_decoder(cipher)
        if self.image_size and max(image.size) != self.image_size:
            scale = self.image_size / max(image.size)
            image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
        return Sample(
            prompt=user_turn(PROMPT.format(coded=coded)),
            images=[image],
            fields={"answer": message, "coded": coded},
            reference=reference_response(message, cipher),
        )


# ------------------------------------------------------------------ rewards
def _chars(text: str) -> str:
    """Canonical character string: lower-case, no whitespace ('i _ c a n' -> 'i_can')."""
    return "".join(text.split()).lower()


def _words(text: str) -> str:
    """Canonical message: `_` as a space, whitespace squashed, lower-case."""
    return squash_spaces(text.replace("_", " "))


def _decoding_score(text: str, answer: str, coded: str) -> float:
    chars = tag_content(text, "chars")
    if chars is None:
        return 0.0
    pred, truth, baseline = _chars(chars), _chars(spell(answer)), _chars(coded)
    if edit_distance(pred, truth) >= edit_distance(baseline, truth):
        return 0.0
    return similarity(pred, truth)


def format_reward(completions: list[str], **_) -> list[float]:
    """1.0 when <think>, <chars> and <answer> blocks appear in that order, each filled (the reward audit found empty
    tags, and a reply echoing the prompt's instructions, paid in full)."""
    return [1.0 if re.search(FORMAT_PATTERN, t, flags=re.DOTALL) and tags_filled(t, "think", "chars", "answer") else 0.0
            for t in completions]


def decoding(completions: list[str], answer: list[str], coded: list[str], **_) -> list[float]:
    """Similarity of <chars> to the true characters, 0 unless closer than the coded message."""
    return [_decoding_score(t, a, c) for t, a, c in zip(completions, answer, coded)]


def correctness(completions: list[str], answer: list[str], coded: list[str], **_) -> list[float]:
    """Similarity of <answer> to the message; 0 unless decoding is perfect and the answer beats the coded text."""
    out = []
    for text, truth, code in zip(completions, answer, coded):
        given = tag_content(text, "answer")
        if given is None or _decoding_score(text, truth, code) < 1.0:
            out.append(0.0)
            continue
        pred, gold, baseline = _words(given), _words(truth), _words(code.replace(" ", "").replace("_", " "))
        out.append(similarity(pred, gold) if edit_distance(pred, gold) < edit_distance(baseline, gold) else 0.0)
    return out


def build(
    split: str = "train",
    size: int = 256,
    seed: int = 0,
    max_words: int = 3,
    image_size: int | None = None,
    path: str | None = None,
    hub_id: str | None = None,
):
    """Synthetic: the `path` and `hub_id` options are accepted and ignored."""
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    return CryptogramDataset(size=size, seed=seed, split=split, max_words=max_words, image_size=image_size)


def _shifted(message: str) -> str:
    """A wrong decoding of the same shape: every letter one further in the alphabet."""
    return "".join(LETTERS[(LETTERS.index(ch) + 1) % 26] if ch in LETTERS else ch for ch in message)


AUDIT = AuditHints(
    answer=lambda sample: sample.fields["answer"],
    layout=lambda sample, reasoning, answer: (f"<think>{reasoning}</think>\n<chars> {spell(answer)} </chars>\n"
                                              f"<answer>{answer}</answer>"),
    candidates=lambda sample, answer: [],  # a free-text message: no list of answers to enumerate
    wrong_answer=lambda sample, answer: _shifted(answer),
)

RECIPE = Recipe(
    name="cryptogram",
    build=build,
    rewards=[Reward("format", format_reward), Reward("decoding", decoding), Reward("correctness", correctness)],
    accuracy_reward="correctness",
    audit=AUDIT,
)
