"""Where each image and each video frame sits in a prompt, for the two ways a family places video.

- Frames as images (InternVL, SmolVLM): every frame is laid out exactly like an image (its own delimiters, the
  image placeholder token). The family's image layout finds one span per image *or frame*; the prompt's part
  order (image / video parts) and each video's frame count say which spans are whose.
- A video token of its own (the Qwen families): image spans come from the image token, video spans from runs
  of the video token. A run is either one frame unit (Qwen3-VL writes a timestamp between temporal patches) or
  a whole video (Qwen2.5-VL), which is cut into its units in order (the tokens are time-major).

A frame unit is what one group of tokens encodes: a frame, or a temporal patch of frames (Qwen's 2).
"""

from __future__ import annotations

from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.adapters.image_layout import token_runs

Span = tuple[int, int]


def split_layouts(layouts: list[Span], kinds: list[str], units: list[int], sample: int, family: str
                  ) -> tuple[list[Span], list[list[Span]]]:
    """Frames-as-images: one sample's image/frame layouts (prompt order) -> (image spans, per-video frame spans)."""
    if len(layouts) != kinds.count("image") + sum(units):
        raise ImageTokenMismatch(f"sample {sample}: the prompt holds {len(layouts)} image or frame layouts but its "
                                 f"{kinds.count('image')} images and videos of {units} frames need "
                                 f"{kinds.count('image') + sum(units)} ({family})")
    images, videos, pos, v = [], [], 0, 0
    for kind in kinds:
        if kind == "image":
            images.append(layouts[pos])
            pos += 1
        else:
            videos.append(layouts[pos : pos + units[v]])
            pos += units[v]
            v += 1
    return images, videos


def video_token_spans(row: list[int], video_token_id: int, units: list[int], sample: int, family: str
                      ) -> list[list[Span]]:
    """A video token of its own: one row's per-video frame-unit spans, from the runs of the video token."""
    runs = token_runs(row, video_token_id)
    if len(runs) == sum(units):  # a run per unit
        out, pos = [], 0
        for n in units:
            out.append(runs[pos : pos + n])
            pos += n
        return out
    if len(runs) == len(units):  # a run per video, time-major: equal slices
        out = []
        for (start, end), n in zip(runs, units):
            if n < 1 or (end - start) % n:
                raise ImageTokenMismatch(f"sample {sample}: a run of {end - start} video tokens does not split into "
                                         f"{n} frame units ({family})")
            step = (end - start) // n
            out.append([(start + k * step, start + (k + 1) * step) for k in range(n)])
        return out
    raise ImageTokenMismatch(f"sample {sample}: the prompt holds {len(runs)} runs of video tokens for {len(units)} "
                             f"videos of {units} frame units ({family})")
