"""Seeing a run: completions next to their images in trackio, tensorboard and wandb (offline), the per-step parquet
files, and report.html. One tiny 2-step run through the command line (a fresh process, so trackio keeps its files
in the run directory and wandb writes only under the test's folder) serves every test here."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import types

import pytest
from PIL import Image

from vlm_grpo.grpo.run import completion_files as cf
from vlm_grpo.grpo.run.logs import RunLog, read_jsonl
from vlm_grpo.grpo.run.completion_tables import log_completion_tables, tracker_table
from vlm_grpo.inspect import report as rp

COMPONENTS = ("correctness", "description", "reasoning")  # the shapes recipe's rewards


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    run_dir = root / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACKIO_", "WANDB_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(root / "wandb"),
               WANDB_DATA_DIR=str(root / "wandb-data"), WANDB_CACHE_DIR=str(root / "wandb-cache"),
               WANDB_CONFIG_DIR=str(root / "wandb-config"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    for name in ("wandb", "wandb-data", "wandb-cache", "wandb-config"):
        (root / name).mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "vlm_grpo.cli", "train", "--model", "tiny:qwen2_5_vl", "--max-steps", "2",
         "--output-dir", str(run_dir), "--max-new-tokens", "6", "--logging.progress", "false",
         "--data.recipe_options", "{image_size: 56}", "--report-to", "trackio,tensorboard,wandb"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return types.SimpleNamespace(dir=run_dir, root=root, out=proc.stdout, rows=read_jsonl(run_dir / "completions.jsonl"))


def test_completions_log_holds_each_prompts_images_saved_inside_the_run(run):
    assert len(run.rows) == 2 * 2 * 4  # steps x prompts x completions
    for row in run.rows:
        assert set(COMPONENTS) <= set(row["rewards"]) and "advantage" in row and "group" in row
        (image,) = row["images"]
        assert image.startswith("completions/images/") and (run.dir / image).is_file()
    with Image.open(run.dir / run.rows[0]["images"][0]) as im:
        assert im.size == (56, 56)
    # a prompt's completions share its image; different prompts of a step have their own
    step1 = [r for r in run.rows if r["step"] == 1]
    assert len({r["images"][0] for r in step1 if r["group"] == 0}) == 1
    assert {r["images"][0] for r in step1 if r["group"] == 0} != {r["images"][0] for r in step1 if r["group"] == 1}


def test_trackio_project_in_the_run_dir_holds_the_completions_table_with_images(run):
    assert f"TRACKIO_DIR={run.dir.resolve() / 'trackio'}" in run.out  # the dashboard's command
    # read as trackio's dashboard reads it: its own storage, pointed at the run's folder
    reader = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; (name,) = S.get_runs('vlm-grpo'); "
              "print(json.dumps([[log['step'], {k: v for k, v in log.items() if k not in ('step', 'timestamp')}] "
              "for log in S.get_logs('vlm-grpo', name)]))")
    env = {**os.environ, "TRACKIO_DIR": str(run.dir / "trackio")}
    logged = json.loads(subprocess.run([sys.executable, "-c", reader], env=env, capture_output=True, text=True,
                                       check=True, timeout=120).stdout)
    tables = {step: m["completions"]["_value"] for step, m in logged if "completions" in m}
    assert sorted(tables) == [1, 2]
    assert any("reward" in m for _, m in logged) and not any("__step" in m for _, m in logged)  # no clash with its step
    for step, table in tables.items():
        assert len(table) == 8
        for row, logged_row in zip(table, [r for r in run.rows if r["step"] == step]):
            assert row["completion"] == logged_row["completion"] and row["advantage"] == pytest.approx(logged_row["advantage"])
            assert set(COMPONENTS) <= set(row) and "flags" in row
            (image,) = row["image"]
            assert image["_type"] == "trackio.image"
            with Image.open(run.dir / "trackio" / "media" / image["file_path"]) as im, \
                    Image.open(run.dir / logged_row["images"][0]) as saved:
                assert im.size == saved.size and im.convert("RGB").tobytes() == saved.convert("RGB").tobytes()


def test_tensorboard_holds_each_prompts_images_and_the_table_as_text(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.dir / "vlm-grpo"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    images = [t for t in acc.Tags()["images"] if t.startswith("completions/images/")]
    assert len(images) == 2  # two prompts per step (logged at both steps under the same tags)
    events = acc.Images(images[0])
    assert [e.step for e in events] == [1, 2] and (events[0].width, events[0].height) == (56, 56)
    (text_tag,) = [t for t in acc.Tags()["tensors"] if t.startswith("completions")]
    text = acc.Tensors(text_tag)[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| step | process | group |") and "| advantage |" in text
    assert text.count("\n") == 8 + 1  # header, rule, one line per completion


def test_wandb_offline_table_holds_the_images(run):
    staged = run.root / "wandb-data" / "artifacts" / "staging"
    tables, pngs = [], 0
    for path in staged.iterdir():
        head = path.read_bytes()[:8]
        if head.startswith(b"\x89PNG"):
            pngs += 1
        elif head.startswith(b"{"):
            table = json.loads(path.read_text())
            if table.get("_type") == "table":
                tables.append(table)
    assert pngs >= 2  # wandb stages a table more than once: every copy holds the images
    assert {row[table["columns"].index("step")] for table in tables for row in table["data"]} == {1, 2}
    for table in tables:
        cols = table["columns"]
        assert {"completion", "reward", "advantage", "flags", "image", *COMPONENTS} <= set(cols)
        cells = [row[cols.index("image")] for row in table["data"]]
        assert len(cells) == 8 and all(c[0]["_type"] == "image-file" and c[0]["width"] == 56 for c in cells)
    assert list((run.root / "wandb").glob("wandb/offline-run-*"))  # and nothing outside the test's folders


def test_parquet_per_step_is_read_by_datasets_with_image_paths(run):
    import datasets

    files = sorted((run.dir / "completions").glob("completions_*.parquet"))
    assert [f.name for f in files] == ["completions_00001.parquet", "completions_00002.parquet"]
    ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    assert len(ds) == len(run.rows)
    assert ds["completion"] == [r["completion"] for r in run.rows]
    assert ds["correctness"] == pytest.approx([r["rewards"]["correctness"] for r in run.rows])
    assert all((run.dir / p).is_file() for paths in ds["images"] for p in paths) and ds["images"][0]
    assert ds["flags"] == [r.get("flags", []) for r in run.rows]


def test_report_written_at_the_end_is_one_offline_file(run):
    page = (run.dir / "report.html").read_text()
    assert "report written to" in run.out
    assert len(page) < 1_500_000
    assert not re.findall(r"""(?:src|href)\s*=\s*["'](?!data:|#)""", page)  # nothing to fetch
    assert "default-src 'none'" in page
    for section in ("curves", "best-worst", "completions", "attention", "settings", "versions"):
        assert f"id='{section}'" in page
    for chart in ("reward", "reward_components", "accuracy", "completion_length", "image_reliance", "guard_trips"):
        assert f'data-chart="{chart}"' in page
    assert page.count('<path class="series"') >= 10
    images = re.findall(r'<img class="prompt-image" src="data:image/png;base64,([^"]+)"', page)
    assert images and all(Image.open(io.BytesIO(base64.b64decode(b))).size == (56, 56)
                          for b in set(images))
    rows = re.findall(r'<tr class="completion[^"]*" data-step="(\d+)"', page)
    assert {"1", "2"} == set(rows)
    flagged = sum(bool(r.get("flags")) for r in run.rows)
    assert page.count('<span class="flag">') >= flagged
    assert "model:\n  name: tiny:qwen2_5_vl" in page and "transformers" in page


def test_report_command_writes_where_asked(run, tmp_path, capsys):
    from vlm_grpo.cli import main

    out = tmp_path / "r.html"
    assert main(["report", str(run.dir), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out and out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(FileNotFoundError):
        rp.build_report(tmp_path)  # not a run


# ---------------------------------------------------------------- pieces, without a run
def test_report_samples_steps_and_ranks_groups():
    assert rp.sampled_steps(list(range(1, 6))) == [1, 2, 3, 4, 5]
    picked = rp.sampled_steps(list(range(1, 101)), 12)
    assert len(picked) == 12 and picked[0] == 1 and picked[-1] == 100
    rows = [{"step": s, "group": g, "process": 0, "prompt": "p", "reward": r, "flags": ["x"] if (s, g) == (1, 2) else []}
            for s in (1, 2) for g in range(6) for r in (g / 10, g / 5)]
    groups = rp.group_rows(rows)
    assert len(groups) == 12 and all(len(g.rows) == 2 for g in groups)
    shown = rp.shown_groups(groups, per_step=3)
    assert len(shown) == 6 and shown[0].rows[0]["group"] == 2  # the flagged prompt first
    best, worst = rp.best_and_worst(groups, 2)
    assert [g.mean_reward for g in best] == pytest.approx([0.75, 0.75]) and worst[0].mean_reward == 0


def test_report_inlines_pictures_within_its_budget(tmp_path):
    Image.new("RGB", (600, 300), (0, 120, 0)).save(tmp_path / "a.png")
    pics = rp.Pictures(tmp_path, budget=10_000)
    uri = pics.uri("a.png")
    assert uri.startswith("data:image/png;base64,") and pics.uri("a.png") is uri
    Image.new("RGB", (8, 8)).save(tmp_path / "b.png")
    pics.budget = 0
    assert pics.uri("b.png") is None and pics.uri("missing.png") is None and pics.skipped == 2


def test_media_saved_once_by_content_with_video_frames(tmp_path):
    red, blue = Image.new("RGB", (1024, 512), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    sample = types.SimpleNamespace(images=[red], videos=[[Image.new("RGB", (8, 8), (k, 0, 0)) for k in range(10)]])
    media = cf.prompt_media(sample)
    assert [f.getpixel((0, 0))[0] for f in media["video_frames"]] == [0, 3, 6, 9]
    rows = [{"step": 1, "process": 0, "group": g, "completion": "c"} for g in (0, 0, 1)]
    out = cf.attach_media(tmp_path, rows, [{"process": 0, "group": 0, **media},
                                           {"process": 0, "group": 1, "images": [red.copy(), blue], "video_frames": []}])
    assert out[0]["images"] == out[2]["images"][:1] and len(out[0]["video_frames"]) == 4
    assert len(list((tmp_path / cf.IMAGES_DIR).iterdir())) == 1 + 1 + 4
    with Image.open(tmp_path / out[0]["images"][0]) as im:
        assert im.size == (cf.MAX_SIDE, cf.MAX_SIDE // 2)


def test_resume_drops_the_parquet_files_of_redone_steps(tmp_path):
    for step in (1, 2, 3):
        cf.write_step_parquet(tmp_path, step, [{"step": step, "completion": "x", "reward": 1.0, "rewards": {"a": 1}}])
        RunLog(tmp_path).metrics({"step": step})
    RunLog(tmp_path).truncate_after(1)
    assert [p.name for p in (tmp_path / "completions").iterdir()] == ["completions_00001.parquet"]


class _Tracker:
    def __init__(self, name):
        self.name, self.logged = name, []

    def log(self, values, step=None):
        self.logged.append((step, values))


def test_trackers_get_text_only_tables_without_log_multimodal_and_mlflow_artifacts(tmp_path, monkeypatch):
    rows = cf.attach_media(tmp_path, [{"step": 3, "process": 0, "group": 0, "completion": "c", "reward": 0.5,
                                       "rewards": {"reward": 0.5, "fmt": 1.0}, "flags": ["enumeration"]}],
                           [{"process": 0, "group": 0, "images": [Image.new("RGB", (8, 8))], "video_frames": []}])
    columns, data = tracker_table(rows, None)
    assert "image" not in columns and "reward_reward" in columns and data[0][columns.index("flags")] == "enumeration"
    calls = []
    fake = types.SimpleNamespace(log_artifact=lambda path, artifact_path: calls.append(("artifact", path, artifact_path)),
                                 log_table=lambda data, artifact_file: calls.append(("table", data, artifact_file)))
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    plain = _Tracker("wandb")
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(Table=lambda columns, data: (columns, data)))
    log_completion_tables([_Tracker("mlflow"), plain], 3, rows, tmp_path, multimodal=False)
    assert calls[0][0] == "table" and "images" not in calls[0][1] and calls[0][2] == "completions/step_00003.json"
    assert plain.logged[0][0] == 3 and "image" not in plain.logged[0][1]["completions"][0]
    calls.clear()
    log_completion_tables([_Tracker("mlflow")], 3, rows, tmp_path)
    assert calls[0] == ("artifact", str(tmp_path / rows[0]["images"][0]), "completions/images")
    assert calls[1][1]["images"] == [rows[0]["images"]]


def test_svg_chart_scales_points_into_its_frame():
    from vlm_grpo.inspect.svg_charts import HEIGHT, LEFT, TOP, WIDTH, line_chart, nice_ticks

    assert nice_ticks(0.0, 1.0) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(3.0, 97.0) == pytest.approx([20.0, 40.0, 60.0, 80.0])
    svg = line_chart("r", "R <1>", [("a", [1, 2, 3], [0.0, 0.5, 1.0]), ("b", [1, 2, 3], [1e-3, 1e-2, 1e-1])], "y")
    assert svg.startswith('<svg class="chart-svg" data-chart="r"') and "R &lt;1&gt;" in svg
    d = re.search(r'<path class="series" d="M([\d.]+) ([\d.]+)L', svg)
    x, y = float(d.group(1)), float(d.group(2))
    assert x == pytest.approx(LEFT) and TOP < y < HEIGHT  # the first step at the left edge, inside the frame
    xs = [float(v) for v in re.findall(r'cx="([\d.]+)"', svg)]
    assert len(xs) == 6 and max(xs) <= WIDTH
    log = line_chart("kl", "KL", [("kl", [1, 2], [1e-4, 1e-2])], "KL", log=True)
    assert "(log)" in log and 'class="series"' in log
    assert 'class="series"' not in line_chart("kl", "KL", [("kl", [1], [0.0])], log=True)  # nothing positive to draw


def test_report_of_a_run_without_completions_and_trl_spelled_settings(tmp_path):
    from vlm_grpo.grpo.settings.sources import load_config

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2)))
    page = (rp.write_report(tmp_path)).read_text()
    assert "no completions logged" in page and 'data-chart="loss"' in page and "config.yaml not found" in page
    assert '<img class="attention-image"' not in page
    (tmp_path / "attention").mkdir()
    Image.new("RGB", (64, 32), (200, 0, 0)).save(tmp_path / "attention" / "heatmap.png")  # vlm-grpo attention --out
    page = (rp.write_report(tmp_path)).read_text()
    assert '<img class="attention-image" src="data:image/png;base64,' in page and "attention/heatmap.png" in page
    cfg = load_config(overrides=["--log_multimodal", "false", "--log-completions", "true", "--report_to", "trackio"])
    assert (cfg.logging.log_multimodal, cfg.logging.log_completions, cfg.logging.report_to) == (False, True, ["trackio"])
    assert cfg.logging.report is True
