"""`compare_counts`: several images in one prompt, interleaved with text. "Image 1: <img> Image 2: <img> Which image
has more circles, the first or the second?"

Generated offline and deterministically from (seed, split, index): two canvases with different numbers of blue
circles (1-5) among red squares. The prompt interleaves the images with text ("Image 1:", "Image 2:"), the layout
real comparison data uses. `images_per_prompt` > 2 (up to 4) shows more pictures and asks which has the most
(answered by ordinal: first, second, third, fourth), so rows of different image counts can share a batch
(`mixed_counts: true`: rows cycle through 1, 2 and 4 images; a single image asks whether it has more than 2 circles).

Rewards: `correctness` (+1.0 when the last answer word the response names is the true one) and `format` (+0.2 when
the response names exactly one answer word).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.audit_hints import AuditHints
from vlm_grpo.recipes.base import Recipe, Reward, Sample
from vlm_grpo.recipes.generated import GeneratedSamples

ORDINALS = ("first", "second", "third", "fourth")
_WORDS = re.compile(r"\b(first|second|third|fourth|yes|no)\b", re.IGNORECASE)


def draw_circles(circles: int, size: int, rng: random.Random) -> Image.Image:
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    r = max(2, size // 14)
    for _ in range(rng.randint(0, 2)):  # red squares: not counted
        x, y = rng.randint(0, size - 2 * r), rng.randint(0, size - 2 * r)
        draw.rectangle([x, y, x + 2 * r, y + 2 * r], fill=(220, 30, 30))
    for _ in range(circles):
        x, y = rng.randint(r, size - r - 1), rng.randint(r, size - r - 1)
        draw.ellipse([x - r, y - r, x + r, y + r], fill=(30, 30, 220))
    return img


def interleaved_turn(question: str, n_images: int) -> list[dict]:
    parts: list[dict] = []
    for k in range(n_images):
        parts += [{"type": "text", "text": f"Image {k + 1}: "}, {"type": "image"}, {"type": "text", "text": "\n"}]
    return [{"role": "user", "content": parts + [{"type": "text", "text": question}]}]


@dataclass
class CompareCountsDataset(GeneratedSamples):
    stream = "compare_counts"
    images_per_prompt: int = 2
    image_size: int = 56
    mixed_counts: bool = False

    def draw(self, index: int, rng: random.Random) -> Sample:
        n = (1, 2, 4)[index % 3] if self.mixed_counts else self.images_per_prompt
        if n == 1:
            circles = [rng.randint(1, 5)]
            question, answer = "Does this image have more than 2 circles? Answer yes or no.", \
                ("yes" if circles[0] > 2 else "no")
        else:
            circles = rng.sample(range(1, 6), n)  # all different: one image has the most
            which = ", ".join(ORDINALS[:n - 1]) + f" or the {ORDINALS[n - 1]}"
            question = f"Which image has {'more' if n == 2 else 'the most'} circles, the {which}?"
            answer = ORDINALS[circles.index(max(circles))]
        images = [draw_circles(c, self.image_size, rng) for c in circles]
        return Sample(prompt=interleaved_turn(question, n), images=images, fields={"answer": answer, "circles": circles},
                      reference=f"The {answer} image." if n > 1 else f"{answer.capitalize()}.")


def answer_words(text: str) -> list[str]:
    return [m.lower() for m in _WORDS.findall(text)]


def correctness(completions: list[str], answer: list[str], **_) -> list[float]:
    """+1.0 when the last answer word (first/second/third/fourth, or yes/no) is the true one."""
    return [1.0 if (found := answer_words(t)) and found[-1] == truth else 0.0 for t, truth in zip(completions, answer)]


def answer_format(completions: list[str], **_) -> list[float]:
    """+0.2 when the response names exactly one answer word."""
    return [0.2 if len(set(answer_words(t))) == 1 else 0.0 for t in completions]


def build(split: str = "train", size: int = 256, seed: int = 0, images_per_prompt: int = 2, image_size: int = 56,
          mixed_counts: bool = False):
    if not 2 <= images_per_prompt <= len(ORDINALS):
        raise ValueError(f"compare_counts: images_per_prompt must be 2..{len(ORDINALS)}, got {images_per_prompt}")
    return CompareCountsDataset(size=size, seed=seed, split=split, images_per_prompt=images_per_prompt,
                                image_size=image_size, mixed_counts=bool(mixed_counts))


def answers_of(sample: Sample, answer: str) -> list[str]:
    """The answers a row takes: an ordinal per image, or yes/no for one image."""
    n = len(sample.fields["circles"])
    return list(ORDINALS[:n]) if n > 1 else ["yes", "no"]


# a bare answer, or one repeated, names exactly one answer word: the form this task's format reward asks for
ONE_WORD_FORMAT = {"format:right_answer_bare": "the task's form is one answer word, which a bare answer is",
                   "format:repeat": "one answer word said again is still one answer word"}


RECIPE = Recipe(
    name="compare_counts",
    build=build,
    rewards=[Reward("correctness", correctness), Reward("format", answer_format)],
    accuracy_reward="correctness",
    audit=AuditHints(candidates=answers_of, accepted=ONE_WORD_FORMAT),
)
