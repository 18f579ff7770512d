"""`moving_square`: a short clip in which a red square moves left, right, up or down; say which way.

Generated offline and deterministically from (seed, split, index), like `shapes`: each clip is `video_frames`
frames (the data setting; 4-8 make a short clip) of a `frame_size`-pixel canvas with a few still grey
distractors, the red square starting where its path fits and moving a fixed step per frame. One frame alone
cannot answer the question: only the order of the frames shows the direction.

Rewards: `correctness` (+1.0 when the last direction the response names is the true one) and `format` (+0.2 when
the response names exactly one direction: an unambiguous answer).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.audit_hints import AuditHints
from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples
from vlm_grpo.videos import Video

DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
QUESTION = "In which direction does the red square move: left, right, up or down?"
FRAME_RATE = 4.0  # frames per second the clip is said to be shot at (timestamps in the prompt for some families)
_WORDS = re.compile(r"\b(left|right|up|down)\b", re.IGNORECASE)


def draw_clip(direction: str, frames: int, size: int, rng: random.Random) -> list[Image.Image]:
    """`frames` frames of the red square moving `direction` over still grey distractors."""
    side = max(4, size // 6)
    step = max(1, (size - side - 2) // max(1, frames - 1) // 2)  # the whole path fits in half the canvas
    dx, dy = DIRECTIONS[direction]
    span = step * (frames - 1)
    x0 = rng.randint(span if dx < 0 else 0, size - side - 1 - (span if dx > 0 else 0))
    y0 = rng.randint(span if dy < 0 else 0, size - side - 1 - (span if dy > 0 else 0))
    distractors = [(rng.randint(0, size - side), rng.randint(0, size - side)) for _ in range(2)]
    out = []
    for t in range(frames):
        img = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(img)
        for x, y in distractors:
            draw.ellipse([x, y, x + side - 1, y + side - 1], fill=(150, 150, 150))
        x, y = x0 + dx * step * t, y0 + dy * step * t
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=(220, 20, 20))
        out.append(img)
    return out


@dataclass
class MovingSquareDataset(GeneratedSamples):
    stream = "moving_square"
    frames: int = 4
    frame_size: int = 56

    def draw(self, index: int, rng: random.Random) -> Sample:
        direction = rng.choice(sorted(DIRECTIONS))
        clip = Video(draw_clip(direction, self.frames, self.frame_size, rng), fps=FRAME_RATE)
        return Sample(
            prompt=user_turn(QUESTION, n_images=0, n_videos=1),
            images=[],
            videos=[clip],
            fields={"answer": direction},
            reference=f"The red square moves {direction}.",
        )


def named_directions(text: str) -> list[str]:
    return [m.lower() for m in _WORDS.findall(text)]


def correctness(completions: list[str], answer: list[str], **_) -> list[float]:
    """+1.0 when the last direction the response names is the true one."""
    return [1.0 if (found := named_directions(t)) and found[-1] == truth else 0.0 for t, truth in zip(completions, answer)]


def answer_format(completions: list[str], **_) -> list[float]:
    """+0.2 when the response names exactly one direction."""
    return [0.2 if len(set(named_directions(t))) == 1 else 0.0 for t in completions]


def build(split: str = "train", size: int = 256, seed: int = 0, frame_size: int = 56, video_frames: int = 4,
          video_fps: float = 0.0, max_video_frames: int = 16, video_max_pixels: int = 224 * 224):
    """Clips of `video_frames` frames (the data setting; at least 2: one frame shows no motion)."""
    if not 2 <= video_frames <= max_video_frames:
        raise ValueError(f"moving_square: data.video_frames must be 2..{max_video_frames} (data.max_video_frames), "
                         f"got {video_frames}")
    if frame_size * frame_size > video_max_pixels or frame_size < 16:
        raise ValueError(f"moving_square: frame_size {frame_size} must be >= 16 px and within data.video_max_pixels "
                         f"({video_max_pixels})")
    return MovingSquareDataset(size=size, seed=seed, split=split, frames=video_frames, frame_size=frame_size)


# a bare answer, or one repeated, names exactly one answer word: the form this task's format reward asks for
ONE_WORD_FORMAT = {"format:right_answer_bare": "the task's form is one answer word, which a bare answer is",
                   "format:repeat": "one answer word said again is still one answer word"}


RECIPE = Recipe(
    name="moving_square",
    build=build,
    rewards=[Reward("correctness", correctness), Reward("format", answer_format)],
    accuracy_reward="correctness",
    takes_video=True,
    audit=AuditHints(candidates=lambda sample, answer: sorted(DIRECTIONS), accepted=ONE_WORD_FORMAT),
)
