"""GRPO on video and on several images per prompt, end to end on tiny twins: every video family on `moving_square`,
every family on `compare_counts` with rows of 1, 2 and 4 images in one batch (about 1 minute on 2 cores)."""

from __future__ import annotations

import pytest

from vlm_grpo.adapters.registry import families, image_families
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

VIDEO_FAMILIES = sorted(name for name, cls in families().items() if cls.takes_video)
ALL_FAMILIES = sorted(image_families())
FRAMES = 4


def train(family: str, recipe: str, out, *extra: str) -> list[dict]:
    cfg = load_config(overrides=[
        "--model", f"tiny:{family}", "--recipe", recipe, "--max-steps", "2", "--output-dir", str(out),
        "--max-new-tokens", "4", "--num-generations", "2", "--logging.progress", "false", *extra,
    ])
    return trained(GRPOTrainer.from_settings(cfg))


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_two_grpo_steps_on_video(family, tmp_path):
    history = train(family, "moving_square", tmp_path, "--batch-size", "2", "--data.train-size", "4",
                    "--data.video-frames", str(FRAMES))
    assert [m["step"] for m in history] == [1, 2]
    assert {"rewards/correctness", "rewards/format"} <= set(history[0])
    adapter = families()[family]
    per_video = 1 if adapter.tiny().video_token_id != adapter.tiny().image_token_id else FRAMES
    for m in history:  # each step's 2 clips, encoded once for all 2 x 2 completions and log-prob forwards
        assert m["perf/vision_calls"] == 1 and m["perf/vision_images"] == 2 * per_video, m
    assert (tmp_path / "final" / "config.json").is_file()
    rows = read_jsonl(tmp_path / "completions.jsonl")  # each clip's frames logged with its completions (log_multimodal)
    assert all(len(r["video_frames"]) == FRAMES and (tmp_path / r["video_frames"][0]).is_file() for r in rows)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_rows_with_one_two_and_four_images_train_together(family, tmp_path):
    history = train(family, "compare_counts", tmp_path, "--batch-size", "3", "--data.train-size", "3",
                    "--data.recipe_options", "{mixed_counts: true, image_size: 56}")
    assert [m["step"] for m in history] == [1, 2]
    assert {"rewards/correctness", "rewards/format"} <= set(history[0])
    # 7 images of 3 prompts, one encoder call a step; without shared features the rollout and the log-prob forward
    # each encode the rows' images
    calls = 1 if families()[family].shares_features else 2
    assert all(m["perf/vision_calls"] == calls for m in history), history
    rows = read_jsonl(tmp_path / "completions.jsonl")  # each prompt's images logged with its completions
    assert sorted({len(r["images"]) for r in rows}) == [1, 2, 4]
