"""`scene_count`: count the shapes of a colour, of a kind, or all of them, in a generated scene; the task of the
SmolLM2-learns-to-see experiment (docs/smollm2-learns-to-see.md), built as seed 004 is on CLEVR and SuperCLEVR.

Splits, each drawn deterministically from (seed, split, index), so nothing is stored:
- `train` and `test` (held out: the same look, unseen images): shapes on a white canvas, one per cell of a 4 x 4
  grid, each filling most of its cell;
- `ood` (a different look, as SuperCLEVR is to CLEVR): a tinted, speckled background, smaller shapes at free
  positions (not on the grid), dark outlines. The questions, colours, kinds and counts are the training ones.

Tasks (`task`): `count` (the question; the reference is the reasoning then the answer, seed 004's
`<think>...</think>\\n<answer>...</answer>`), or `caption` (every shape in reading order: the alignment stage's
target, which teaches the tower and projector what is where with the LM frozen).

The rewards are the clevr_count recipe's (seed 004's): format 0.5, correctness 2.0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.audit_hints import AuditHints, generic_candidates, inline_think_layout
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.clevr_count import correctness, strict_format

COLOURS = {"red": (220, 30, 30), "green": (30, 160, 40), "blue": (30, 60, 220), "yellow": (235, 200, 20)}
KINDS = ("circle", "square", "triangle")
CANVAS, GRID = 256, 4
CELL = CANVAS // GRID
MAX_OBJECTS = 8
SPLITS = ("train", "test", "ood")
TASKS = ("count", "caption")
SYSTEM_PROMPT = "Reason inside <think></think>, then give the number inside <answer></answer>."
CAPTION_PROMPT = "List every shape in the image, row by row."


@dataclass(frozen=True)
class Shape:
    colour: str
    kind: str
    x: int  # centre, canvas pixels
    y: int
    size: int  # half-width


def plural(kind: str) -> str:
    return kind + "s"


def scene(rng: random.Random, ood: bool) -> list[Shape]:
    """The shapes, in reading order (by grid row, then left to right)."""
    n = rng.randint(1, MAX_OBJECTS)
    if not ood:
        cells = rng.sample(range(GRID * GRID), n)
        shapes = [Shape(rng.choice(list(COLOURS)), rng.choice(KINDS), (c % GRID) * CELL + CELL // 2 + rng.randint(-4, 4),
                        (c // GRID) * CELL + CELL // 2 + rng.randint(-4, 4), rng.randint(20, 27)) for c in cells]
        return sorted(shapes, key=lambda s: (s.y // CELL, s.x))
    placed: list[Shape] = []
    while len(placed) < n:  # free positions, no overlap; always fits (at most 8 small shapes)
        size = rng.randint(12, 20)
        x, y = rng.randint(size + 4, CANVAS - size - 4), rng.randint(size + 4, CANVAS - size - 4)
        if all(abs(x - p.x) > size + p.size + 4 or abs(y - p.y) > size + p.size + 4 for p in placed):
            placed.append(Shape(rng.choice(list(COLOURS)), rng.choice(KINDS), x, y, size))
    return sorted(placed, key=lambda s: (s.y // CELL, s.x))


def draw(shapes: list[Shape], rng: random.Random, ood: bool) -> Image.Image:
    if ood:
        tint = tuple(rng.randint(150, 215) for _ in range(3))
        img = Image.new("RGB", (CANVAS, CANVAS), tint)
        pen = ImageDraw.Draw(img)
        for _ in range(400):  # speckle: texture the training look never has
            x, y = rng.randrange(CANVAS), rng.randrange(CANVAS)
            shade = tuple(max(0, c - rng.randint(20, 60)) for c in tint)
            pen.rectangle([x, y, x + 2, y + 2], fill=shade)
    else:
        img = Image.new("RGB", (CANVAS, CANVAS), "white")
        pen = ImageDraw.Draw(img)
    outline = (20, 20, 20) if ood else None
    for s in shapes:
        box = [(s.x - s.size, s.y - s.size), (s.x + s.size, s.y + s.size)]
        fill = COLOURS[s.colour]
        if s.kind == "circle":
            pen.ellipse(box, fill=fill, outline=outline, width=2)
        elif s.kind == "square":
            pen.rectangle(box, fill=fill, outline=outline, width=2)
        else:
            pen.polygon([(s.x, s.y - s.size), (s.x - s.size, s.y + s.size), (s.x + s.size, s.y + s.size)], fill=fill,
                        outline=outline, width=2)
    return img


def question(shapes: list[Shape], rng: random.Random) -> tuple[str, list[Shape]]:
    """A question about a colour, a kind or all shapes (always one that is present), and the shapes it counts."""
    asked = rng.choice(("all", "colour", "kind"))
    if asked == "colour":
        colour = rng.choice(sorted({s.colour for s in shapes}))
        return f"How many {colour} shapes are in the image?", [s for s in shapes if s.colour == colour]
    if asked == "kind":
        kind = rng.choice(sorted({s.kind for s in shapes}))
        return f"How many {plural(kind)} are in the image?", [s for s in shapes if s.kind == kind]
    return "How many shapes are in the image?", list(shapes)


def listing(shapes: list[Shape]) -> str:
    return ", ".join(f"{s.colour} {s.kind}" for s in shapes)


@dataclass
class SceneDataset:
    size: int
    seed: int = 0
    split: str = "train"
    task: str = "count"
    image_size: int = 64

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < self.size:
            raise IndexError(index)
        rng = random.Random(f"scene_count/{self.seed}/{self.split}/{index}")
        ood = self.split == "ood"
        shapes = scene(rng, ood)
        image = draw(shapes, rng, ood)
        if self.image_size != CANVAS:
            image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
        if self.task == "caption":
            caption = listing(shapes)
            return Sample(prompt=user_turn(CAPTION_PROMPT), images=[image], fields={"answer": caption}, reference=caption)
        text, counted = question(shapes, rng)
        answer = str(len(counted))
        return Sample(
            prompt=[{"role": "system", "content": SYSTEM_PROMPT}, *user_turn(text)],
            images=[image],
            fields={"answer": answer},
            reference=f"<think>{listing(counted)}</think>\n<answer>{answer}</answer>",
        )


def build(split: str = "train", size: int = 256, seed: int = 0, task: str = "count", image_size: int = 64):
    if split not in SPLITS:
        raise ValueError(f"scene_count split {split!r}: choose one of {', '.join(SPLITS)}")
    if task not in TASKS:
        raise ValueError(f"scene_count task {task!r}: choose one of {', '.join(TASKS)}")
    if int(image_size) < 16:
        raise ValueError(f"scene_count image_size {image_size}: at least 16 pixels")
    return SceneDataset(size=int(size), seed=seed, split=split, task=task, image_size=int(image_size))


AUDIT = AuditHints(
    answer=lambda sample: str(sample.fields["answer"]),
    layout=inline_think_layout,
    candidates=lambda sample, answer: generic_candidates(answer),
)

RECIPE = Recipe(
    name="scene_count",
    build=build,
    rewards=[Reward("format", strict_format), Reward("correctness", correctness)],
    accuracy_reward="correctness",
    audit=AUDIT,
)
