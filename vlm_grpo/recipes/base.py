"""What a recipe is: a dataset builder, a prompt template, named rewards and default settings.

Task knowledge lives here and nowhere else: adapters know models, the loop knows GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from PIL import Image

# A reward scores completions; every other sample field arrives as a keyword list aligned with them.
RewardFn = Callable[..., list[float]]
# The keyword arguments the loop passes every reward itself (TRL's names); a sample field must not take one.
REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")


@dataclass
class Sample:
    prompt: list[dict[str, Any]]  # chat messages; image parts are {"type": "image"}
    images: list[Image.Image]
    fields: dict[str, Any] = field(default_factory=dict)  # ground truth etc., passed to rewards
    reference: str | None = None  # a reference response, for SFT
    # The prompt as a TRL-format dataset row wrote it (a string or chat messages); None when a recipe wrote the
    # prompt. Rewards are called as TRL calls them: a chat-message prompt gives chat-message completions.
    data_prompt: str | list[dict[str, Any]] | None = None
    # Video clips for the prompt's {"type": "video"} parts, in order: vlm_grpo.videos.Video or lists of PIL frames.
    videos: list[Any] = field(default_factory=list)


class SampleSource(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Sample: ...


@dataclass
class Reward:
    name: str
    fn: RewardFn
    weight: float = 1.0


@dataclass
class Recipe:
    name: str
    build: Callable[..., SampleSource]  # build(split=..., size=..., seed=...) -> samples
    rewards: list[Reward]
    accuracy_reward: str | None = None  # the component that means "the answer is right"
    defaults: dict[str, Any] = field(default_factory=dict)  # config overrides this task needs
    checks_rows: bool = False  # build() reads a dataset's rows and takes on_bad_sample (error | skip), path, hub_id
    takes_columns: bool = False  # build() takes the column names prompt_key, image_key, answer_key
    takes_video: bool = False  # build() takes the video settings video_frames, video_fps, max_video_frames, video_max_pixels
    # Multi-turn rollouts (TRL 1.16's contract): functions the model may call, and an environment class whose
    # public methods are tools (reset(**row) per rollout, optional get_reward()).
    tools: list[Callable] = field(default_factory=list)
    environment: Any = None
    audit: Any = None  # an AuditHints (recipes/audit_hints.py): the right answer, allowed answers, the layout


def user_turn(text: str, n_images: int = 1, n_videos: int = 0) -> list[dict[str, Any]]:
    parts = [{"type": "image"}] * n_images + [{"type": "video"}] * n_videos
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def expand(values: Sequence[Any], times: int) -> list[Any]:
    """Each value `times` in a row: a sample's fields for its G completions."""
    return [v for v in values for _ in range(times)]
