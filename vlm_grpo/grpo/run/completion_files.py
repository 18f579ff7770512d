"""Each logged step's completions as files in the run directory, laid out as TRL lays them out:
completions/completions_NNNNN.parquet (one row per completion, each reward a column) that pandas, pyarrow and datasets
read directly, and, with `log_multimodal`, each prompt's images and video frames under completions/images/, referenced
from the rows by their path inside the run directory.

Images are stored under a name made from their content, so a prompt drawn again (or the same image in several prompts)
is stored once. The stored copy is cut to MAX_SIDE pixels: enough to judge an answer by, small enough for every step.
Every file goes through grpo/safe_files.py (a fresh temporary file renamed into place, never through a link), so a kill
never leaves half a file.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any, Sequence

from PIL import Image

from vlm_grpo.grpo.rollout.turns import loggable_messages
from vlm_grpo.grpo import safe_files

COMPLETIONS_DIR = "completions"
IMAGES_DIR = f"{COMPLETIONS_DIR}/images"
PARQUET = re.compile(r"completions_(\d+)\.parquet")
MAX_SIDE = 512  # pixels of the longer side of a stored image
VIDEO_FRAMES = 4  # frames kept from each video (evenly spaced)
FIXED_COLUMNS = ("step", "process", "group", "sample_index", "prompt", "completion", "reward", "advantage", "flags",
                 "images", "video_frames")


def parquet_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / COMPLETIONS_DIR / f"completions_{step:05d}.parquet"


def prompt_media(sample: Any) -> dict[str, list[Image.Image]]:
    """A sample's pictures: its images, and a few evenly spaced frames of each of its videos."""
    frames: list[Image.Image] = []
    for video in getattr(sample, "videos", None) or []:
        clip = list(getattr(video, "frames", video))
        if clip:
            n = min(VIDEO_FRAMES, len(clip))
            frames += [clip[round(k * (len(clip) - 1) / max(n - 1, 1))] for k in range(n)]
    return {"images": list(getattr(sample, "images", None) or []), "video_frames": frames}


def save_image(run_dir: Path, image: Image.Image) -> str:
    """The image as a PNG under completions/images/ (named by its content); its path inside the run directory."""
    image = image.convert("RGB")
    if max(image.size) > MAX_SIDE:
        image = image.copy()
        image.thumbnail((MAX_SIDE, MAX_SIDE))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    data = buf.getvalue()
    rel = f"{IMAGES_DIR}/{hashlib.sha1(data).hexdigest()[:20]}.png"
    if not (Path(run_dir) / rel).exists():
        safe_files.write_run_path(run_dir, rel, data)
    return rel


def attach_media(run_dir: Path, rows: list[dict[str, Any]], media: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each prompt's pictures saved, their paths added to its completions' rows (`images`, `video_frames`).

    `media`: one entry per prompt, {"process", "group", "images", "video_frames"} (the PIL pictures)."""
    saved = {(m["process"], m["group"]): {kind: [save_image(run_dir, im) for im in m[kind]]
                                          for kind in ("images", "video_frames")} for m in media}
    out = []
    for row in rows:
        paths = saved.get((row.get("process", 0), row.get("group")))
        out.append({**row, **{k: v for k, v in paths.items() if v}} if paths else row)
    return out


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """completions.jsonl rows as flat table rows: each reward component its own column (TRL names them by the
    reward; one that clashes with a fixed column gets a `reward_` prefix), flags and picture paths as lists, tool
    turns and rewards' extra values as JSON text."""
    names = list(dict.fromkeys(name for r in rows for name in r.get("rewards", {})))
    out = []
    for r in rows:
        row = {key: r.get(key) for key in FIXED_COLUMNS[:8]}
        row["reward"] = _float(row["reward"])
        row["advantage"] = _float(row["advantage"])
        for name in names:
            row[f"reward_{name}" if name in FIXED_COLUMNS else name] = _float(r.get("rewards", {}).get(name))
        row["flags"] = [str(f) for f in r.get("flags", [])]
        row["images"] = list(r.get("images", []))
        row["video_frames"] = list(r.get("video_frames", []))
        for key in ("extra", "turns"):
            if key in r:
                row[key] = json.dumps(r[key], default=str)
        out.append(row)
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def write_step_parquet(run_dir: Path, step: int, rows: Sequence[dict[str, Any]]) -> Path | None:
    """completions/completions_NNNNN.parquet for one step (nothing when the step logged no completion)."""
    if not rows:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = table_rows(rows)
    schema = {"flags": pa.list_(pa.string()), "images": pa.list_(pa.string()), "video_frames": pa.list_(pa.string())}
    columns = list(dict.fromkeys(key for row in flat for key in row))
    table = pa.table({key: pa.array([row.get(key) for row in flat], type=schema.get(key)) for key in columns})
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    path = parquet_path(run_dir, step)
    return safe_files.write_run_path(run_dir, str(path.relative_to(run_dir)), buf.getvalue().to_pybytes())


def remove_after(run_dir: Path, step: int) -> None:
    """The per-step files of steps after `step` (a resumed run logs them again)."""
    folder = Path(run_dir) / COMPLETIONS_DIR
    if folder.is_dir():
        for path in folder.glob("completions_*.parquet"):
            match = PARQUET.fullmatch(path.name)
            if match and int(match.group(1)) > step:
                safe_files.remove(path)


def save_step(run_dir: Path, step: int, rows: list[dict[str, Any]], media: Sequence[dict[str, Any]] | None
              ) -> list[dict[str, Any]]:
    """A step's rows with their pictures saved (`media`: None with log_multimodal off) and the step's parquet file
    written; the rows, picture paths added, for completions.jsonl and the trackers."""
    if media is not None:
        rows = attach_media(run_dir, rows, media)
    write_step_parquet(run_dir, step, rows)
    return rows


def _loggable(value: Any) -> Any:
    """A value a reward logged, as completions.jsonl can hold it (anything but plain scalars as text)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def completion_rows(traj, step: int, process: int, flags_of) -> list[dict[str, Any]]:
    """One row per completion of a scored trajectory: prompt, completion, reward and its components, advantage (a
    token-level advantage as its mean over the training tokens), the guards' flags (`flags_of(i)`), what rewards
    logged (extra) and a tool rollout's turns."""
    g = traj.num_generations
    advantages = traj.advantages
    if advantages.dim() > 1:
        mask = traj.loss_mask
        advantages = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
    rows = []
    for i, text in enumerate(traj.completions):
        rows.append({
            "step": step,
            "process": process,
            "group": i // g,
            "sample_index": traj.sample_indices[i // g],
            "prompt": traj.prompt_texts[i // g],
            "completion": text,
            "reward": traj.rewards[i].item(),
            "rewards": {name: v[i].item() for name, v in traj.reward_components.items()},
            "advantage": advantages[i].item(),
            **flags_of(i),
            **({"extra": {k: _loggable(v[i]) for k, v in traj.extra.items()}} if traj.extra else {}),
            **({"turns": loggable_messages(traj.conversations[i])} if traj.conversations else {}),
        })
    return rows
