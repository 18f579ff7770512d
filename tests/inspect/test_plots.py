"""`vlm-grpo plot`: charts from a real tiny run, and the pieces they are built from."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vlm_grpo.cli import main
from vlm_grpo.inspect.plots import RunData, accuracy_by_length, accuracy_per_step, smooth, write_plots
from tests.trained import trained


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.api.trainers import GRPOTrainer

    out = tmp_path_factory.mktemp("run")
    cfg = load_config(overrides=[
        "--model", "tiny:qwen2_5_vl", "--max-steps", "3", "--output-dir", str(out), "--max-new-tokens", "8",
        "--logging.progress", "false", "--data.recipe_options", "{image_size: 56}",
    ])
    trained(GRPOTrainer.from_settings(cfg))
    return out


def test_plot_command_writes_valid_pngs_next_to_the_run(tiny_run, capsys):
    assert main(["plot", str(tiny_run)]) == 0
    printed = capsys.readouterr().out.split()
    plots = tiny_run / "plots"
    names = {p.stem for p in plots.glob("*.png")}
    assert {"reward", "reward_components", "accuracy", "completion_length", "clip_fraction", "entropy",
            "accuracy_by_length", "overview"} <= names
    assert len(printed) == len(names)
    for path in plots.glob("*.png"):
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert img.format == "PNG"
            assert img.width >= 400 and img.height >= 250
            assert path.stat().st_size < 1_000_000
            if path.stem != "overview":
                assert img.getextrema() != ((255, 255), (255, 255), (255, 255), (255, 255))  # not blank
    with Image.open(plots / "overview.png") as ov, Image.open(plots / "reward.png") as one:
        assert ov.width > one.width and ov.height > one.height


def test_kl_chart_only_when_logged_and_log_scale(tmp_path):
    rows = [{"step": s, "reward": 0.1 * s, "kl": 10.0 ** (-4 + s), "entropy": 1.0} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = [p.stem for p in write_plots(tmp_path)]
    assert "kl" in names and "accuracy" not in names and names[-1] == "overview"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.0}) + "\n")
    assert "kl" not in [p.stem for p in write_plots(tmp_path, tmp_path / "other")]


def test_accuracy_from_completions_and_by_length(tmp_path):
    comps = []
    for step in (1, 2):
        for k in range(4):
            text = " ".join(["word"] * (2 + 10 * k))
            comps.append({"step": step, "completion": text, "reward": 1.0,
                          "rewards": {"correctness": 1.0 if (k < 2 or step == 2) else 0.0, "format": 1.0}})
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in comps))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 1.0}) + "\n")
    data = RunData.load(tmp_path)
    assert data.accuracy_component() == "correctness"
    assert data.accuracy_component("format") == "format"
    steps, acc = accuracy_per_step(data, "correctness")
    assert steps.tolist() == [1, 2] and acc.tolist() == [0.5, 1.0]
    buckets = accuracy_by_length(data, "correctness", unit="words", buckets=2)
    assert sum(n for _, _, n in buckets) == 8
    assert buckets[0][1] > buckets[-1][1]  # the short answers were the right ones
    chars = accuracy_by_length(data, "correctness", unit="chars", buckets=4)
    assert [label for label, _, _ in chars][0].startswith("9")  # "word word" = 9 characters


def test_smooth_keeps_short_series_and_tracks_the_trend():
    assert smooth(np.array([1.0, 3.0, 2.0])).tolist() == [1.0, 3.0, 2.0]
    noisy = np.linspace(0, 1, 200) + np.random.default_rng(0).normal(0, 0.2, 200)
    s = smooth(noisy)
    assert np.abs(np.diff(s)).mean() < np.abs(np.diff(noisy)).mean() / 3
    assert s[0] == pytest.approx(noisy[0])  # debiased: no pull towards zero at the start


def test_plot_of_a_folder_without_logs_fails_clearly(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1  # failed (2: a refused setting)
    assert "metrics.jsonl" in capsys.readouterr().err
