"""Fixture writers shared by the recipe tests: small generated images, row files, a 2-step smoke run."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image
from tests.trained import trained

COLORS = ("red", "green", "blue", "orange", "purple", "gray")


def image(index: int = 0, size: int = 56) -> Image.Image:
    img = Image.new("RGB", (size, size), "white")
    img.paste(COLORS[index % len(COLORS)], (8, 8, size - 8, size - 8))
    return img


def png_bytes(index: int = 0, size: int = 56) -> bytes:
    buf = io.BytesIO()
    image(index, size).save(buf, format="PNG")
    return buf.getvalue()


def save_image(path: Path, index: int = 0, size: int = 56) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image(index, size).save(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def smoke_train(recipe: str, out: Path, options: str) -> list[dict]:
    """Two GRPO steps of `recipe` on the tiny Qwen2.5-VL twin."""
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.api.trainers import GRPOTrainer

    cfg = load_config(overrides=[
        "--model", "tiny:qwen2_5_vl", "--recipe", recipe, "--max-steps", "2", "--output-dir", str(out),
        "--max-new-tokens", "8", "--logging.progress", "false", "--data.train-size", "4",
        "--data.recipe_options", options,
    ])
    return trained(GRPOTrainer.from_settings(cfg))


IMAGE_RECIPES = ["shapes", "cryptogram", "vsr", "clevr_count", "mm_math"]  # every image recipe, rows from `data` fixtures


def check_two_grpo_steps(model: str, recipe: str, options: str, out: Path) -> None:
    """Two GRPO steps of `recipe` on `model` (B=1, G=2, 4 tokens): both logged, each recipe reward logged, a final
    model saved."""
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.api.trainers import GRPOTrainer
    from vlm_grpo.recipes import get_recipe

    cfg = load_config(overrides=[
        "--model", model, "--recipe", recipe, "--max-steps", "2", "--output-dir", str(out),
        "--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2", "--data.train-size", "2",
        "--logging.progress", "false", "--data.recipe_options", options,
    ])
    history = trained(GRPOTrainer.from_settings(cfg))
    assert [m["step"] for m in history] == [1, 2]
    assert {f"rewards/{r.name}" for r in get_recipe(recipe).rewards} <= set(history[0])
    assert (out / "final" / "config.json").is_file()


def same_sample(a, b) -> bool:
    return (
        a.prompt == b.prompt and a.fields == b.fields and a.reference == b.reference
        and [i.tobytes() for i in a.images] == [i.tobytes() for i in b.images]
    )


def write_clip(path: Path, frames: int = 6, size: int = 48, fps: int = 4) -> Path:
    """A small MPEG-4 file (PyAV) of a white bar sliding right over black, `frames` frames at `fps`."""
    import av
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for t in range(frames):
            pixels = np.zeros((size, size, 3), np.uint8)
            pixels[:, t * size // frames : (t + 1) * size // frames] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
