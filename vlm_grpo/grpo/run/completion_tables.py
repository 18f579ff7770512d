"""Each logged step's completions, with their prompts' images, in every tracker the run reports to.

The same table everywhere (prompt, completion, reward and each component, advantage, the guards' flags, the images),
in each tracker's own way: a `completions` table with image cells in wandb and trackio (as TRL logs it), images plus
a markdown table as text in tensorboard, and the images and the table as artifacts in mlflow. The pictures are the
copies saved under completions/images/ (grpo/run/completion_files.py), opened by their path inside the run directory
and only there (safe_files.run_file: no link, no path outside it; a refused picture fails that tracker's table only).
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.completion_files import IMAGES_DIR, table_rows
from vlm_grpo.markdown_text import code_span, escaped

log = logging.getLogger(__name__)

TABLE = "completions"  # the key the table is logged under (TRL's)
TEXT_CHARS = 400  # a prompt or completion longer than this is cut in tensorboard's text table


def tracker_table(rows: Sequence[dict[str, Any]], image: Callable[[Path], Any] | None) -> tuple[list[str], list[list]]:
    """(columns, data) of one step: the flat columns of the parquet file with flags joined, the picture paths
    replaced by lists of `image(path)` objects of the tracker under `image` and `video_frames` (TRL's column name;
    a picture column only when some row has such pictures, none when `image` is None)."""
    flat = table_rows(rows)
    columns = [c for c in dict.fromkeys(k for row in flat for k in row) if c not in ("images", "video_frames")]
    kinds = [k for k in ("images", "video_frames") if image is not None and any(row[k] for row in flat)]
    data = []
    for row in flat:
        cells = [", ".join(row[c]) if c == "flags" else row.get(c) for c in columns]
        data.append(cells + [[image(p) for p in row[kind]] for kind in kinds])
    return columns + [{"images": "image"}.get(k, k) for k in kinds], data


def _log_table(module_name: str):
    """wandb and trackio: a `completions` table whose image cells hold the tracker's Image objects (TRL's layout)."""

    def log_step(tracker, step: int, rows, run_dir: Path, multimodal: bool) -> None:
        import functools

        module = __import__(module_name)
        # one Image object per picture: a prompt's G rows share it
        image = functools.lru_cache(maxsize=None)(lambda p: module.Image(str(safe_files.run_file(run_dir, p)))) \
            if multimodal else None
        columns, data = tracker_table(rows, image)
        tracker.log({TABLE: module.Table(columns=columns, data=data)}, step=step)

    return log_step


def _log_tensorboard(tracker, step: int, rows, run_dir: Path, multimodal: bool) -> None:
    """Each prompt's images under completions/images/<prompt>, the table as markdown text under completions."""
    writer = tracker.tracker
    columns, data = tracker_table(rows, None)
    if multimodal:
        seen: set[tuple] = set()
        for row in rows:
            key = (row.get("process", 0), row.get("group"))
            if key in seen:
                continue
            seen.add(key)
            for k, path in enumerate(row.get("images", []) + row.get("video_frames", [])):
                with Image.open(io.BytesIO(safe_files.read_run_file(run_dir, path))) as im:
                    pixels = np.asarray(im.convert("RGB"))
                writer.add_image(f"{TABLE}/images/prompt_{key[0]}_{key[1]}_{k}", pixels, global_step=step,
                                 dataformats="HWC")
    writer.add_text(TABLE, _markdown(columns, data), global_step=step)
    writer.flush()


def _markdown(columns: list[str], data: list[list]) -> str:
    def cell(v: Any) -> str:  # a prompt or completion as text, whatever it holds (markdown_text.py)
        if v is None or isinstance(v, (bool, int, float)):
            return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
        return code_span(v, cell=True, limit=TEXT_CHARS)

    # a column may carry a reward's name (settings text): escaped like the model's text
    lines = ["| " + " | ".join(escaped(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in data])


def _log_mlflow(tracker, step: int, rows, run_dir: Path, multimodal: bool) -> None:
    """The table as an artifact (completions/step_NNNNN.json, image paths as columns) and the step's image files."""
    import mlflow

    columns, data = tracker_table(rows, None)
    flat = table_rows(rows)
    table = {c: [row[i] for row in data] for i, c in enumerate(columns)}
    if multimodal:
        table["images"] = [row["images"] for row in flat]
        table["video_frames"] = [row["video_frames"] for row in flat]
        for path in sorted({p for row in flat for p in row["images"] + row["video_frames"]}):
            mlflow.log_artifact(str(safe_files.run_file(run_dir, path)), artifact_path=IMAGES_DIR)  # content-named: a repeat overwrites
    mlflow.log_table(data=table, artifact_file=f"{TABLE}/step_{step:05d}.json")


LOGGERS = {"wandb": _log_table("wandb"), "trackio": _log_table("trackio"), "tensorboard": _log_tensorboard,
           "mlflow": _log_mlflow}


def log_completion_tables(trackers: Sequence[Any], step: int, rows: Sequence[dict[str, Any]], run_dir: Path,
                          multimodal: bool = True) -> None:
    """One step's completions to each started tracker (accelerate's GeneralTracker objects); a tracker that fails to
    take the table warns once per step and the run goes on (the numbers were logged already)."""
    if not rows:
        return
    for tracker in trackers:
        logger = LOGGERS.get(getattr(tracker, "name", ""))
        if logger is None:
            continue
        try:
            logger(tracker, step, rows, Path(run_dir), multimodal)
        except Exception as err:  # noqa: BLE001 - a tracker's own failure must not stop training
            log.warning("could not log step %d's completions table to %s: %s", step, tracker.name, err)
