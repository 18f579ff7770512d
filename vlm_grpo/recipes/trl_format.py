"""`trl`: your own data in TRL's GRPO format, scored by the rewards you name (`--reward`).

A row holds a prompt (a string, or chat messages whose content parts may be `{"type": "image"}` or
`{"type": "video"}`), its images in an `images` (a list) or `image` column (PIL images, encoded bytes,
`{"bytes", "path"}` records or file paths, read as every file recipe reads them), its videos in a `videos` (a list)
or `video` column (each a list of frames or a video file, see recipes/video_rows.py), and any other columns: each reaches the rewards under its own name, the
image column as decoded images. Column names are options, EasyR1's keys: `prompt_key` (default `prompt`),
`image_key` (default `images`, else `image`), `answer_key`; an answer column named otherwise also reaches the
rewards as `solution`, the name TRL's reward functions read. A `completion` column is the reference response
(for `vlm-grpo sft`), not a reward argument, as in TRL.

The prompt the model sees:
- a string: one user turn, the row's images first, then its videos, then the text;
- chat messages: kept as written, system turns and earlier turns included; their image parts must be as many
  as the row's images. Messages that are all plain strings get the images in front of the first user turn's
  text, as TRL places them. String contents become text parts (some chat templates read only lists of parts).

Rows come from a local JSONL/JSON/parquet file or folder, or a hub id (streamed, images kept encoded until a
sample is taken; image paths only to that dataset's own files, see recipes/rows.py). A bad row stops the run naming the source, row and field, or is left out with
`on_bad_sample: skip`. The recipe has no rewards of its own; rewards written for TRL run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlm_grpo.adapters.batch import image_parts, video_parts
from vlm_grpo.recipes.base import REWARD_ARGUMENTS, Recipe, Sample, user_turn
from vlm_grpo.recipes.file_recipe import read_samples, with_source_options
from vlm_grpo.recipes.rows import ImageRef, RecordDataset, RowChecker
from vlm_grpo.recipes.video_rows import VideoSettings, check_videos

ROLES = ("system", "user", "assistant")
REFERENCE_COLUMN = "completion"  # TRL's prompt-completion format: the reference answer, never a reward argument


@dataclass(frozen=True)
class Columns:
    prompt: str = "prompt"
    image: str | None = None  # None: `images` when the row has it, else `image`, else no images
    answer: str | None = None


def check_messages(checker: RowChecker, index: int, key: str, messages: list) -> None:
    """Every message a mapping with a known role and string content or a list of text/image parts."""
    if not messages:
        raise checker.fail(index, key, "is an empty list of messages")
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise checker.fail(index, key, f"message {k} is not a chat message (a mapping with role and content)")
        if message["role"] not in ROLES:
            raise checker.fail(index, key, f"message {k} has role {message['role']!r}; expected {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise checker.fail(index, key, f"message {k}: content must be a string or a list of parts, "
                               f"got {type(content).__name__}")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            # Arrow-backed sets give every part every key, None where unused: only a value present counts.
            if kind == "image" and part.get("image") is not None:
                raise checker.fail(index, key, f"message {k} part {j} carries its image inline; put the images "
                                   "in the image column and leave {\"type\": \"image\"} in the prompt")
            if kind == "text" and not isinstance(part.get("text"), str):
                raise checker.fail(index, key, f"message {k} part {j}: a text part needs a string 'text'")
            if kind == "video" and part.get("video") is not None:
                raise checker.fail(index, key, f"message {k} part {j} carries its video inline; put the videos "
                                   "in the video column and leave {\"type\": \"video\"} in the prompt")
            if kind not in ("text", "image", "video"):
                raise checker.fail(index, key, f"message {k} part {j} has type {kind!r}; expected text, image or video")


def as_parts(messages: list[dict], n_images: int, n_videos: int = 0) -> list[dict[str, Any]]:
    """Clean messages with list contents. All-string messages get the images, then the videos, before the first user
    turn's text."""
    placed = any(isinstance(m.get("content"), list) for m in messages)  # structured: image parts say where
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
            if not placed and message["role"] == "user":
                parts = [{"type": "image"}] * n_images + [{"type": "video"}] * n_videos + parts
                placed = True
        else:
            parts = [{"type": p["type"]} if p["type"] in ("image", "video") else {"type": "text", "text": p["text"]}
                     for p in content]
        out.append({"role": message["role"], "content": parts})
    return out


def check_images(checker: RowChecker, index: int, row: dict, key: str | None) -> tuple[str | None, list[ImageRef], bool]:
    """(the image column, its images checked, whether the column holds a list). None/[]: a row without images."""
    if key is None:
        key = next((k for k in ("images", "image") if row.get(k) is not None), None)
        if key is None:
            return None, [], False
    elif key not in row:
        raise checker.fail(index, key, "is missing (image_key names it)")
    value = row[key]
    if value is None:
        return key, [], False
    if not isinstance(value, list):
        return key, [checker.image(index, {key: value}, (key,))], False
    # Each item is checked on its own, so a message names the item: field 'images[2]'.
    return key, [checker.image(index, {f"{key}[{k}]": item}, (f"{key}[{k}]",)) for k, item in enumerate(value)], True


def reference_text(checker: RowChecker, index: int, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        texts = []
        for m in value:
            content = m.get("content")
            texts += [content] if isinstance(content, str) else [p.get("text") or "" for p in content or [] if isinstance(p, dict)]
        return "".join(texts)
    raise checker.fail(index, REFERENCE_COLUMN, f"must be a string or chat messages, got {type(value).__name__}")


def check_row(checker: RowChecker, index: int, row: dict, columns: Columns, video: VideoSettings = VideoSettings()) -> dict:
    key = columns.prompt
    prompt = row.get(key)
    if prompt is None:
        raise checker.fail(index, key, "is missing" + ("" if key != "prompt" else " (set prompt_key to name another column)"))
    if isinstance(prompt, str):
        checker.text(index, row, key)
    elif isinstance(prompt, list):
        check_messages(checker, index, key, prompt)
    else:
        raise checker.fail(index, key, f"must be a string or a list of chat messages, got {type(prompt).__name__}")
    image_column, images, image_list = check_images(checker, index, row, columns.image)
    video_column, videos = check_videos(checker, index, row, video)
    if isinstance(prompt, str):
        messages = user_turn(prompt, len(images), len(videos))
    else:
        messages = as_parts(prompt, len(images), len(videos))
        if image_parts(messages) != len(images):
            raise checker.fail(index, key, f"has {image_parts(messages)} image parts but the row has {len(images)} "
                               f"images (field {image_column or 'images'!r})")
        if video_parts(messages) != len(videos):
            raise checker.fail(index, key, f"has {video_parts(messages)} video parts but the row has {len(videos)} "
                               f"videos (field {video_column or 'videos'!r})")
    fields = {k: v for k, v in row.items() if k not in (key, image_column, video_column, REFERENCE_COLUMN)}
    for name in fields:
        if name in REWARD_ARGUMENTS:
            raise checker.fail(index, name, f"has the name of an argument every reward receives "
                               f"({', '.join(REWARD_ARGUMENTS)}): rename the column")
    if columns.answer is not None:
        if row.get(columns.answer) is None:
            raise checker.fail(index, columns.answer, "is missing (answer_key names it)")
        if columns.answer != "solution":
            if row.get("solution") is not None:
                raise checker.fail(index, "solution", f"is a column too, and the answer column {columns.answer!r} "
                                   "also reaches the rewards as 'solution': drop one or set answer_key: solution")
            fields["solution"] = row[columns.answer]
    return {
        "messages": messages, "data_prompt": prompt, "images": images, "image_column": image_column,
        "image_list": image_list, "videos": videos, "fields": fields, "reference": reference_text(checker, index, row.get(REFERENCE_COLUMN)),
    }


def to_sample(record: dict, image_size: int | None, video: VideoSettings = VideoSettings()) -> Sample:
    images = [ref.load(image_size) for ref in record["images"]]
    fields = dict(record["fields"])
    if record["image_column"] is not None:  # rewards see the image column as TRL passes it: decoded
        fields[record["image_column"]] = images if record["image_list"] else (images[0] if images else None)
    return Sample(prompt=record["messages"], images=images, fields=fields, reference=record["reference"],
                  data_prompt=record["data_prompt"], videos=[ref.load(video) for ref in record["videos"]])


@with_source_options
def build(
    prompt_key: str | None = None,
    image_key: str | None = None,
    answer_key: str | None = None,
    video_frames: int = 8,
    video_fps: float = 0.0,
    max_video_frames: int = 16,
    video_max_pixels: int = 224 * 224,
    **source: Any,
) -> RecordDataset:
    """The first `size` rows (all when 0/None), in the source's order (recipes/file_recipe.py: the options); the
    column names and the video settings are this recipe's own."""
    columns = Columns(prompt_key or "prompt", image_key, answer_key)
    video = VideoSettings(video_frames, video_fps, max_video_frames, video_max_pixels)
    return read_samples(lambda c, i, r: check_row(c, i, r, columns, video),
                        lambda record, image_size: to_sample(record, image_size, video), **source)


RECIPE = Recipe(
    name="trl",
    build=build,
    rewards=[],  # the user's: --reward module:function (data.rewards)
    accuracy_reward="accuracy",  # a reward named `accuracy` (e.g. my_rewards.py:accuracy) is eval's accuracy
    checks_rows=True,
    takes_columns=True,
    takes_video=True,
)
