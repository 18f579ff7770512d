"""`shapes`: count red triangles, blue circles or green squares on a white canvas (the task of the
shape-counting chapter, one of the project's source recipes).

Images are generated deterministically from (seed, index), so a split is reproducible without
storing anything. Counts are 1-5 per shape for training; `counts=(6, 7)` gives the shape-counting chapter's
cross-generalization test set.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.audit_hints import AuditHints
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples

SHAPES = ("triangles", "circles", "squares")
CANVAS = 256
# Words that show the response describes the asked-about shape (its name or colour).
DESCRIPTION_WORDS = {
    "triangles": ("triangle", "red", "triangular"),
    "circles": ("circle", "blue", "circular"),
    "squares": ("square", "green", "rectangular"),
}
REASONING_WORDS = ("therefore", "so", "total", "the count is", "the answer is")


def draw_shapes(counts: dict[str, int], rng: random.Random) -> Image.Image:
    img = Image.new("RGB", (CANVAS, CANVAS), "white")
    draw = ImageDraw.Draw(img)
    for _ in range(counts["triangles"]):
        x, y, s = rng.randint(20, 236), rng.randint(20, 236), rng.randint(15, 35)
        draw.polygon([(x, y - s), (x - s, y + s), (x + s, y + s)], fill="red", outline="darkred")
    for _ in range(counts["circles"]):
        x, y, r = rng.randint(20, 236), rng.randint(20, 236), rng.randint(10, 25)
        draw.ellipse([(x - r, y - r), (x + r, y + r)], fill="blue", outline="darkblue")
    for _ in range(counts["squares"]):
        x, y, s = rng.randint(20, 236), rng.randint(20, 236), rng.randint(12, 28)
        draw.rectangle([(x - s, y - s), (x + s, y + s)], fill="green", outline="darkgreen")
    return img


REFERENCE_STYLES = ("chapter", "short", "bare")


def reference_answer(counts: dict[str, int], target: str, style: str = "chapter") -> str:
    """The SFT target. "chapter": the shape-counting chapter's full sentence (describe, reason, answer); "short":
    the same three counts, reasoning and answer in about half the tokens (cheaper SFT and rollouts on small
    models); "bare": only the number, the chapter's "before GRPO" answer."""
    seen = ", ".join(f"{counts[s]} {s}" for s in SHAPES)
    if style == "short":
        return f"I see {seen}. So the number of {target} is {counts[target]}."
    if style == "bare":
        return f"{counts[target]}."
    if style != "chapter":
        raise ValueError(f"unknown shapes reference style {style!r}; choose one of {', '.join(REFERENCE_STYLES)}")
    return f"I see {seen} in the image. The question is about {target}. So the number of {target} is {counts[target]}."


def reference_mix(reference: str | dict[str, float]) -> dict[str, float]:
    """A style name, or a mapping style -> share (e.g. {bare: 0.85, short: 0.15}), as normalised shares."""
    mix = {reference: 1.0} if isinstance(reference, str) else {str(k): float(v) for k, v in dict(reference).items()}
    unknown = [s for s in mix if s not in REFERENCE_STYLES]
    if unknown or not mix or any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"shapes reference {reference!r}: give a style ({', '.join(REFERENCE_STYLES)}) or a mapping "
                         "of styles to non-negative shares")
    total = sum(mix.values())
    return {s: v / total for s, v in mix.items()}


@dataclass
class ShapesDataset(GeneratedSamples):
    stream = "shapes"
    counts: tuple[int, int] = (1, 5)
    image_size: int = CANVAS  # images are drawn at 256 px and resized for small models
    reference: str | dict[str, float] = "chapter"  # style of Sample.reference (SFT only), or a mix of styles
    # > 1: that many canvases per prompt, the question about all of them (counts summed); the first is drawn as
    # with one, so the default's samples are unchanged
    images_per_prompt: int = 1

    def draw(self, index: int, rng: random.Random) -> Sample:
        counts = {s: rng.randint(*self.counts) for s in SHAPES}
        target = SHAPES[rng.randint(0, 2)]
        images = [draw_shapes(counts, rng)]
        total = dict(counts)
        for _ in range(self.images_per_prompt - 1):
            more = {s: rng.randint(*self.counts) for s in SHAPES}
            images.append(draw_shapes(more, rng))
            total = {s: total[s] + more[s] for s in SHAPES}
        if self.image_size != CANVAS:
            images = [image.resize((self.image_size, self.image_size), Image.BILINEAR) for image in images]
        where = "the image" if len(images) == 1 else f"these {len(images)} images together"
        return Sample(
            prompt=user_turn(f"How many {target} are in {where}?", n_images=len(images)),
            images=images,
            fields={"answer": str(total[target]), "target": target, "counts": total},
            reference=reference_answer(total, target, self._style(index)),
        )


    def _style(self, index: int) -> str:
        mix = reference_mix(self.reference)
        if len(mix) == 1:
            return next(iter(mix))
        # its own random stream: the images and questions do not depend on the mix
        draw = self.rng(index, stream="shapes-style").random()
        for style, share in mix.items():
            draw -= share
            if draw < 0:
                return style
        return style


def correctness(completions: list[str], answer: list[str], **_) -> list[float]:
    """+1.0 when the last number in the response is the true count."""
    out = []
    for text, truth in zip(completions, answer):
        numbers = re.findall(r"\d+", text)
        out.append(1.0 if numbers and numbers[-1] == str(truth) else 0.0)
    return out


def description(completions: list[str], target: list[str], **_) -> list[float]:
    """+0.5 when the response mentions the asked-about shape or its colour."""
    return [0.5 if any(w in t.lower() for w in DESCRIPTION_WORDS[s]) else 0.0 for t, s in zip(completions, target)]


def reasoning(completions: list[str], **_) -> list[float]:
    """+0.2 when the response uses a reasoning phrase ('so', 'therefore', 'the answer is', ...)."""
    return [0.2 if any(w in t.lower() for w in REASONING_WORDS) else 0.0 for t in completions]


def build(split: str = "train", size: int = 256, seed: int = 0, counts: tuple[int, int] | None = None, image_size: int = CANVAS,
          reference: str | dict[str, float] = "chapter", images_per_prompt: int = 1):
    if counts is None:
        counts = (1, 5)
    reference_mix(reference)  # checked now, not at the first sample
    if isinstance(images_per_prompt, bool) or not isinstance(images_per_prompt, int) or not 1 <= images_per_prompt <= 64:
        raise ValueError(f"shapes images_per_prompt {images_per_prompt!r}: give a whole number from 1 to 64")
    return ShapesDataset(size=size, seed=seed, split=split, counts=tuple(counts), image_size=image_size, reference=reference,
                         images_per_prompt=images_per_prompt)


def _layout(sample: Sample, reasoning_text: str, answer: str) -> str:
    """The chapter's closing sentence after any reasoning: "... So the number of squares is 3."."""
    return f"{reasoning_text} So the number of {sample.fields['target']} is {answer}.".strip()


AUDIT = AuditHints(
    answer=lambda sample: str(sample.fields["answer"]),
    layout=_layout,
    candidates=lambda sample, answer: [str(k) for k in range(1, max(5, int(answer)) + 1)],
    accepted={  # the chapter's shaping rewards: they teach the form and are worth less than a right count
        "description": "a shaping reward by design: it pays naming the asked-about shape, right count or not "
                       "(0.5, below correctness' 1.0)",
        "reasoning": "a shaping reward by design: it pays a reasoning phrase, right count or not (0.2)",
    },
)

RECIPE = Recipe(
    name="shapes",
    build=build,
    rewards=[Reward("correctness", correctness), Reward("description", description), Reward("reasoning", reasoning)],
    accuracy_reward="correctness",
    audit=AUDIT,
)
