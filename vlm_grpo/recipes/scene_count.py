"""`scene_count`: questions about the shapes of a generated scene (name one shape's colour or kind, or count them);
the task of the SmolLM2-learns-to-see experiment (docs/smollm2-learns-to-see.md), built as "Can an LLM Learn to See?"
(a blog post fine-tuning a 0.5B instruct LM with SFT + GRPO) is on CLEVR and SuperCLEVR.

Splits, each drawn deterministically from (seed, split, index), so nothing is stored:
- `train`, `val` and `test` (the same look, other draws: `val` for design choices, `test` held out for the final
  table): shapes on a white canvas, one per cell of a 4 x 4 grid, each filling most of its cell;
- `ood` and `ood_val` (a different look, as SuperCLEVR is to CLEVR; `ood_val` for design choices): a tinted,
  speckled background, smaller shapes at free positions (not on the grid), dark outlines. The questions, colours,
  kinds and counts are the training ones.
  Cell labels and words (`cells`, `cell_words`) are given for the training look only.

Tasks (`task`):
- `attribute` (the experiment's task): "What colour is the triangle?" / "What shape is the red one?" about the one
  shape of the scene that has the named kind (or colour), among 1-8 shapes (`asks`: both, or only colour or kind
  questions); the reference is
  `<think>the red shape is a triangle</think>\n<answer>red</answer>`. Reading one image token, which a 135M LM
  does once the token sits at its words (vlm_grpo/experiment/words.py).
- `count` (the blog post's task): how many shapes of a colour, of a kind, or in all; the reference is the reasoning then
  the answer, the blog post's `<think>...</think>\n<answer>...</answer>`: the counts of the kind of attribute asked
  about, then the answer picked or summed from them. A 135M LM stayed at chance on it after SFT
  (docs/smollm2-learns-to-see.md).
- `caption` (the scene's counts by colour and by kind): a caption alignment target for the tower and projector
  with the LM frozen. It states counts, not lists in reading order: a count is a sum over the image tokens, which a
  frozen LM reads far sooner than an order (an ordered-list caption left the image unused after 100 alignment
  steps: its loss stayed at the text prior's).

The reasoning (`reasoning`): `counts` (the blog post's form, above) or `cells` (each grid cell in reading order, the
counted shapes numbered as they are reached: `cell_walk`).

Each question's sample names its `question_type` (colour or kind; count all, count colour or count kind), so the
evaluation reports accuracy by type.

Count questions draw their answer first, uniform over 1..8, and build the scene to hold it: the question alone
gives no better guess than 1 in 8 (`question`); attribute questions draw theirs uniform over the colours or kinds
(`attribute_question`). Captions describe scenes drawn as they come.

The rewards are the clevr_count recipe's (the blog post's): format 0.5, correctness 2.0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from PIL import Image, ImageDraw

from vlm_grpo.recipes.audit_hints import AuditHints, generic_candidates, inline_think_layout
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples
from vlm_grpo.recipes.clevr_count import correctness, strict_format

COLOURS = {"red": (220, 30, 30), "green": (30, 160, 40), "blue": (30, 60, 220), "yellow": (235, 200, 20)}
KINDS = ("circle", "square", "triangle")
CANVAS, GRID = 256, 4
CELL = CANVAS // GRID
MAX_OBJECTS = 8
SPLITS = ("train", "val", "test", "ood", "ood_val")
OOD_SPLITS = ("ood", "ood_val")  # the other look
TASKS = ("count", "caption", "attribute")
ASKS = ("both", "colour", "kind")  # which attribute questions `task: attribute` asks
SYSTEM_PROMPT = "Reason inside <think></think>, then give the number inside <answer></answer>."
ATTRIBUTE_PROMPT = "Reason inside <think></think>, then give the word inside <answer></answer>."
# The caption's layout is in the prompt: with the LM frozen, a layout the text does not give would be learnt by the
# image tokens as a constant soft prompt, at the cost of the image's content (measured: the projected features
# collapsed to one vector, the same for every image).
CAPTION_PROMPT = ("Count the shapes in the image by colour and by kind. Answer as: red N, green N, blue N, yellow N; "
                  "circle N, square N, triangle N")


@dataclass(frozen=True)
class Shape:
    colour: str
    kind: str
    x: int  # centre, canvas pixels
    y: int
    size: int  # half-width


def plural(kind: str) -> str:
    return kind + "s"


def scene(rng: random.Random, ood: bool, n: int | None = None) -> list[Shape]:
    """`n` shapes (drawn from 1..MAX_OBJECTS when not given), in reading order (by grid row, then left to right)."""
    n = rng.randint(1, MAX_OBJECTS) if n is None else n
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


def question(rng: random.Random, ood: bool) -> tuple[str, str, list[Shape], list[Shape]]:
    """A scene and a question about a colour, a kind or all its shapes: the text, what it asks about (colour, kind,
    all), the scene's shapes and those the question counts. The answer is drawn first, uniform over
    1..MAX_OBJECTS for every kind of question, and the scene built to hold it: a model that guesses from the question
    alone scores 1 in MAX_OBJECTS. (Drawn from random scenes instead, most colour and kind answers are 1 or 2, the
    question alone scores 30%, and GRPO learned to guess: measured, docs/smollm2-learns-to-see.md.)"""
    asked = rng.choice(("all", "colour", "kind"))
    answer = rng.randint(1, MAX_OBJECTS)
    if asked == "all":
        shapes = scene(rng, ood, answer)
        return "How many shapes are in the image?", asked, shapes, list(shapes)
    shapes = scene(rng, ood, rng.randint(answer, MAX_OBJECTS))
    field, values = ("colour", list(COLOURS)) if asked == "colour" else ("kind", list(KINDS))
    target = rng.choice(values)
    chosen = set(rng.sample(range(len(shapes)), answer))
    others = [v for v in values if v != target]
    shapes = [replace(s, **{field: target if i in chosen else rng.choice(others)}) for i, s in enumerate(shapes)]
    text = f"How many {target} shapes are in the image?" if asked == "colour" else f"How many {plural(target)} are in the image?"
    return text, asked, shapes, [s for s in shapes if getattr(s, field) == target]


def attribute_question(rng: random.Random, ood: bool, asks: str = "both") -> tuple[str, list[Shape], Shape, str]:
    """A scene in which one shape alone has the kind (or the colour) asked about, and the question for its other
    attribute: "What colour is the triangle?" or "What shape is the red one?". The text, the scene, the shape asked
    about and the answer. The answer is drawn first, uniform over the colours (or kinds), and so is the number of
    shapes (1..MAX_OBJECTS): the question alone is worth 1 in 4 (or 3). The other shapes take every other value at
    random, the answer's included: the answer is bound to the one shape, not read off the scene's colours."""
    drawn = rng.random() < 0.5  # drawn whatever `asks`, so that `both` keeps its samples
    by_colour = {"both": drawn, "colour": True, "kind": False}[asks]  # ask the colour of the only shape of a kind
    known_field, asked_field = ("kind", "colour") if by_colour else ("colour", "kind")
    known_values, asked_values = (list(KINDS), list(COLOURS)) if by_colour else (list(COLOURS), list(KINDS))
    known, answer = rng.choice(known_values), rng.choice(asked_values)
    shapes = scene(rng, ood)
    target = rng.randrange(len(shapes))
    others = [v for v in known_values if v != known]
    shapes = [replace(s, **({known_field: known, asked_field: answer} if i == target else
                            {known_field: rng.choice(others), asked_field: rng.choice(asked_values)}))
              for i, s in enumerate(shapes)]
    text = f"What colour is the {known}?" if by_colour else f"What shape is the {known} one?"
    return text, shapes, shapes[target], answer


def cell_labels(shapes: list[Shape]) -> list[int]:
    """What each cell of the 4 x 4 grid holds, row by row: 0 empty, else 1 + colour * 3 + kind (the training look
    only, one shape per cell): the labels a vision tower is pretrained on (vlm_grpo/experiment/tower.py)."""
    labels = [0] * (GRID * GRID)
    for s in shapes:
        labels[(s.y // CELL) * GRID + s.x // CELL] = 1 + list(COLOURS).index(s.colour) * len(KINDS) + KINDS.index(s.kind)
    return labels


CELL_WORDS = ["empty"] + [f"{c} {k}" for c in COLOURS for k in KINDS]  # each cell label in words
CELL_CLASSES = len(CELL_WORDS)


def cell_words(shapes: list[Shape]) -> list[str]:
    """What each cell of the grid holds, row by row, in words: "empty" or "red circle" (the training look only): the
    words an image token is aligned to (vlm_grpo/experiment/words.py)."""
    return [CELL_WORDS[label] for label in cell_labels(shapes)]


def colour_counts(shapes: list[Shape]) -> str:
    return ", ".join(f"{c} {sum(s.colour == c for s in shapes)}" for c in COLOURS)


def kind_counts(shapes: list[Shape]) -> str:
    return ", ".join(f"{k} {sum(s.kind == k for s in shapes)}" for k in KINDS)


def caption(shapes: list[Shape]) -> str:
    """"red 2, green 0, blue 1, yellow 0; circle 1, square 2, triangle 0"."""
    return f"{colour_counts(shapes)}; {kind_counts(shapes)}"


def reasoning(shapes: list[Shape], asked: str) -> str:
    """The counts of the attribute asked about; for all shapes, the kinds' counts and their sum."""
    if asked == "colour":
        return colour_counts(shapes)
    if asked == "kind":
        return kind_counts(shapes)
    per_kind = [sum(s.kind == k for s in shapes) for k in KINDS]
    return f"{kind_counts(shapes)}, so {' + '.join(map(str, per_kind))} = {sum(per_kind)}"


def cell_walk(shapes: list[Shape], counted: list[Shape]) -> str:
    """Every cell of the 4 x 4 grid in reading order ("none" when empty, rows split by ";"), each counted shape
    numbered as it is reached: "none, 1 red circle, blue square, none; ..."; the last number is the answer. Reading
    the k-th cell is a fixed step from the k-th image token, and the count is a running number, where stating a
    total at once asks a 135M LM to count image tokens (measured: off by one or more in 60% of the counts)."""
    number, cells = 0, [[] for _ in range(GRID * GRID)]
    for s in shapes:
        said = f"{s.colour} {s.kind}"
        if any(s is c for c in counted):
            number += 1
            said = f"{number} {said}"
        cells[min(s.y // CELL, GRID - 1) * GRID + min(s.x // CELL, GRID - 1)].append(said)  # OOD: a cell may hold two
    walk = [" and ".join(c) or "none" for c in cells]
    return "; ".join(", ".join(walk[r * GRID:(r + 1) * GRID]) for r in range(GRID))


REASONING = {"counts": lambda shapes, asked, counted: reasoning(shapes, asked),
             "cells": lambda shapes, asked, counted: cell_walk(shapes, counted)}


@dataclass
class SceneDataset(GeneratedSamples):
    stream = "scene_count"
    task: str = "count"
    image_size: int = 64
    reasoning: str = "counts"
    asks: str = "both"  # attribute questions: colour, kind or both

    def position(self, index: int) -> str:
        """Every split is a stream of its own (named, not offset): the OOD splits are drawn differently anyway."""
        return f"{self.split}/{index}"

    def draw(self, index: int, rng: random.Random) -> Sample:
        ood = self.split in OOD_SPLITS
        if self.task == "caption":
            shapes = scene(rng, ood)
            image, cells = self.picture(shapes, rng, ood)
            described = caption(shapes)
            return Sample(prompt=user_turn(CAPTION_PROMPT), images=[image], fields={"answer": described, **cells},
                          reference=described)
        if self.task == "attribute":
            text, shapes, target, answer = attribute_question(rng, ood, self.asks)
            image, cells = self.picture(shapes, rng, ood)
            return Sample(
                prompt=[{"role": "system", "content": ATTRIBUTE_PROMPT}, *user_turn(text)],
                images=[image],
                fields={"answer": answer, "question_type": "colour" if answer in COLOURS else "kind", **cells},
                reference=f"<think>the {target.colour} shape is a {target.kind}</think>\n<answer>{answer}</answer>",
            )
        text, asked, shapes, counted = question(rng, ood)
        image, cells = self.picture(shapes, rng, ood)
        answer = str(len(counted))
        return Sample(
            prompt=[{"role": "system", "content": SYSTEM_PROMPT}, *user_turn(text)],
            images=[image],
            fields={"answer": answer, "question_type": f"count {asked}", **cells},
            reference=f"<think>{REASONING[self.reasoning](shapes, asked, counted)}</think>\n<answer>{answer}</answer>",
        )

    def picture(self, shapes: list[Shape], rng: random.Random, ood: bool) -> tuple[Image.Image, dict]:
        """The scene drawn at the model's size, its counts by colour then by kind, and what each cell holds, as a
        label and in words (the training look only: an OOD cell may hold two shapes)."""
        image = draw(shapes, rng, ood)
        if self.image_size != CANVAS:
            image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
        counts = [sum(s.colour == c for s in shapes) for c in COLOURS] + [sum(s.kind == k for s in shapes) for k in KINDS]
        return image, {"counts": counts, **({} if ood else {"cells": cell_labels(shapes), "cell_words": cell_words(shapes)})}


def build(split: str = "train", size: int = 256, seed: int = 0, task: str = "count", image_size: int = 64,
          reasoning: str = "counts", asks: str = "both"):
    if split not in SPLITS:
        raise ValueError(f"scene_count split {split!r}: choose one of {', '.join(SPLITS)}")
    if task not in TASKS:
        raise ValueError(f"scene_count task {task!r}: choose one of {', '.join(TASKS)}")
    if int(image_size) < 16:
        raise ValueError(f"scene_count image_size {image_size}: at least 16 pixels")
    if reasoning not in REASONING:
        raise ValueError(f"scene_count reasoning {reasoning!r}: choose one of {', '.join(REASONING)}")
    if asks not in ASKS:
        raise ValueError(f"scene_count asks {asks!r}: choose one of {', '.join(ASKS)}")
    return SceneDataset(size=int(size), seed=seed, split=split, task=task, image_size=int(image_size),
                        reasoning=reasoning, asks=asks)


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
