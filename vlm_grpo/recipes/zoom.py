"""`zoom`: read small digits on a large canvas by zooming in with a crop tool ("thinking with images").

A `canvas`-px picture (512 by default) holds a few small seven-segment digits (`digit_height` px) among grey
clutter; the prompt shows it at `view_size` px (64), where the digits are a pixel or two tall and cannot be read.
The recipe's environment (TRL 1.16's contract) offers `crop(x, y, width, height)`: the region of the full-size
canvas, enlarged so its longer side is `zoom_size` px (128), returned as an image the model sees in a tool turn.
Answer: the digits, left to right. Images and digits come from (seed, index): a split is reproducible.

Rewards: `answer` (+1: the last number of the final message is the digits) and `tool_use` (+0.5: at least one
call, all well formed, none failed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples
from vlm_grpo.recipes.tool_rewards import final_number_answer, tool_use

# Seven-segment digits: which of the segments a b c d e f g (top, upper right, lower right, bottom, lower left,
# upper left, middle) each digit lights.
SEGMENTS = {"0": "abcdef", "1": "bc", "2": "abdeg", "3": "abcdg", "4": "bcfg", "5": "acdfg", "6": "acdefg",
            "7": "abc", "8": "abcdefg", "9": "abcdfg"}


def draw_digit(draw: ImageDraw.ImageDraw, digit: str, x: int, y: int, height: int, colour="black") -> None:
    """A seven-segment digit with its top-left corner at (x, y), `height` px tall and half as wide."""
    w, h, t = height // 2, height // 2, max(1, height // 7)
    ends = {"a": ((x, y), (x + w, y)), "b": ((x + w, y), (x + w, y + h)), "c": ((x + w, y + h), (x + w, y + 2 * h)),
            "d": ((x, y + 2 * h), (x + w, y + 2 * h)), "e": ((x, y + h), (x, y + 2 * h)), "f": ((x, y), (x, y + h)),
            "g": ((x, y + h), (x + w, y + h))}
    for segment in SEGMENTS[digit]:
        draw.line(ends[segment], fill=colour, width=t)


def draw_canvas(digits: str, rng: random.Random, size: int, digit_height: int) -> Image.Image:
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    for _ in range(12):  # clutter: grey strokes that are not digits
        x, y = rng.randint(0, size - 20), rng.randint(0, size - 20)
        draw.line((x, y, x + rng.randint(5, 20), y + rng.randint(-8, 8)), fill=(170, 170, 170), width=2)
    lane = (size - 2 * digit_height) // len(digits)  # one lane per digit keeps left-to-right order unambiguous
    for k, digit in enumerate(digits):
        x = digit_height + k * lane + rng.randint(0, max(0, lane - digit_height))
        y = rng.randint(digit_height, size - 3 * digit_height)
        draw_digit(draw, digit, x, y, digit_height)
    return img


class ZoomEnvironment:
    """The crop tool over a sample's full-size canvas (one instance per rollout, reset with the sample's row)."""

    def reset(self, canvas: Image.Image | None = None, zoom_size: int = 128, **_) -> None:
        self.canvas, self.zoom_size = canvas, zoom_size

    def crop(self, x: int, y: int, width: int, height: int) -> Image.Image:
        """Crop a region of the full-size image and return it enlarged, to read small details.

        Args:
            x: left edge of the region, in pixels of the full-size image
            y: top edge of the region, in pixels of the full-size image
            width: width of the region in pixels
            height: height of the region in pixels
        """
        size = self.canvas.width
        if width < 4 or height < 4 or x < 0 or y < 0 or x + width > size or y + height > size:
            raise ValueError(f"the region must lie inside the {size}x{size} image and be at least 4x4 pixels")
        region = self.canvas.crop((x, y, x + width, y + height))
        scale = self.zoom_size / max(width, height)
        return region.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.BICUBIC)


@dataclass
class ZoomDataset(GeneratedSamples):
    stream = "zoom"
    digits: int = 3
    canvas: int = 512
    view_size: int = 64
    digit_height: int = 14
    zoom_size: int = 128

    def draw(self, index: int, rng: random.Random) -> Sample:
        digits = "".join(rng.choice("0123456789") for _ in range(self.digits))
        canvas = draw_canvas(digits, rng, self.canvas, self.digit_height)
        question = (f"The picture is {self.canvas}x{self.canvas} pixels, shown here small. Read the {self.digits} "
                    "digits written on it, left to right. Zoom in with the crop tool, then answer with the digits.")
        return Sample(
            prompt=user_turn(question),
            images=[canvas.resize((self.view_size, self.view_size), Image.BILINEAR)],
            fields={"answer": digits, "canvas": canvas, "zoom_size": self.zoom_size},
            reference=f"The digits are {digits}.",
        )


answer = final_number_answer  # +1.0 when the last number of the final message is the digits


def build(split: str = "train", size: int = 256, seed: int = 0, digits: int = 3, canvas: int = 512,
          view_size: int = 64, digit_height: int = 14, zoom_size: int = 128) -> ZoomDataset:
    if not 1 <= digits <= 8 or canvas < 8 * digit_height or min(view_size, zoom_size) < 8:
        raise ValueError(f"zoom: digits must be 1..8, canvas at least 8 x digit_height, view_size and zoom_size at "
                         f"least 8 (got digits={digits}, canvas={canvas}, digit_height={digit_height}, "
                         f"view_size={view_size}, zoom_size={zoom_size})")
    return ZoomDataset(size, seed, split, digits, canvas, view_size, digit_height, zoom_size)


RECIPE = Recipe(
    name="zoom",
    build=build,
    rewards=[Reward("answer", answer), Reward("tool_use", tool_use)],
    accuracy_reward="answer",
    environment=ZoomEnvironment,
)
