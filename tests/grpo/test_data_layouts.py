"""`--dataset` reads what `datasets` reads: every layout below is generated offline and trains 2 GRPO steps, its rows
checked as ever (a bad row named, or skipped), `--dataset-split` and `--dataset-config` choose what is read."""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

import pytest

from tests.recipes.helpers import png_bytes, save_image, write_jsonl, write_parquet
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_recipe_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.recipes.trl_format import build
from tests.trained import trained

FAST = ["--max-new-tokens", "4", "--logging.progress", "false", "--max-steps", "2", "--batch-size", "2",
        "--num-generations", "2", "--log-completions", "false", "--save-every", "0",
        "--reward", "tests/grpo/toy_rewards.py:lowercase_share"]
COLOURS = ["red", "green", "blue", "orange"]


def rows(images) -> list[dict]:
    """Four TRL-format rows; `images(i)` is how row i holds its image in this layout."""
    return [{"prompt": f"Which colour is square {i}?", "image": images(i), "solution": COLOURS[i]} for i in range(4)]


def as_dataset(image_bytes: bool = True):
    import datasets

    data = datasets.Dataset.from_list(rows(lambda i: {"bytes": png_bytes(i), "path": None}))
    return data.cast_column("image", datasets.Image())


def jsonl(root: Path) -> str:
    for i in range(4):
        save_image(root / "images" / f"{i}.png", i)
    return str(write_jsonl(root / "train.jsonl", rows(lambda i: f"{i}.png")))  # found in images/


def json_file(root: Path) -> str:
    for i in range(4):
        save_image(root / f"{i}.png", i)
    (root / "rows.json").write_text(json.dumps(rows(lambda i: f"{i}.png")))
    return str(root / "rows.json")


def parquet(root: Path) -> str:
    return str(write_parquet(root / "rows.parquet", rows(lambda i: {"bytes": png_bytes(i), "path": None})))


def csv_file(root: Path) -> str:
    for i in range(4):
        save_image(root / f"{i}.png", i)
    with open(root / "rows.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["prompt", "image", "solution"])
        writer.writeheader()
        writer.writerows(rows(lambda i: f"{i}.png"))
    return str(root / "rows.csv")


def saved(root: Path) -> str:
    as_dataset().save_to_disk(str(root / "saved"))
    return str(root / "saved")


def arrow(root: Path) -> str:
    as_dataset().save_to_disk(str(root / "saved"))
    return str(next((root / "saved").glob("*.arrow")))


def saved_dict(root: Path) -> str:
    import datasets

    data = as_dataset()
    datasets.DatasetDict({"train": data.select([0]), "more": data}).save_to_disk(str(root / "dict"))
    return str(root / "dict")


def imagefolder(root: Path) -> str:
    for i in range(4):
        save_image(root / "pics" / f"{i}.png", i)
    write_jsonl(root / "pics" / "metadata.jsonl", [{"file_name": f"{i}.png", "prompt": f"Colour of square {i}?",
                                                    "solution": COLOURS[i]} for i in range(4)])
    return str(root / "pics")


def hub_layout(root: Path) -> str:
    data = as_dataset()
    (root / "hub" / "data").mkdir(parents=True)
    for k in range(2):
        data.shard(2, k).to_parquet(str(root / "hub" / "data" / f"train-0000{k}-of-00002.parquet"))
    return str(root / "hub")


def configs(root: Path) -> str:
    """A hub-style folder whose README declares two configurations (datasets' `configs:` front matter)."""
    data = as_dataset()
    for name, part in (("small", data.select([0, 1])), ("colours", data)):
        (root / "cfg" / name).mkdir(parents=True)
        part.to_parquet(str(root / "cfg" / name / "train-00000-of-00001.parquet"))
    (root / "cfg" / "README.md").write_text(
        "---\nconfigs:\n- config_name: small\n  data_files:\n  - split: train\n    path: small/*.parquet\n"
        "- config_name: colours\n  data_files:\n  - split: train\n    path: colours/*.parquet\n---\n")
    return str(root / "cfg")


# layout -> (writer, extra settings, rows the run reads)
LAYOUTS = {
    "jsonl": (jsonl, [], 4),
    "json": (json_file, [], 4),
    "parquet": (parquet, [], 4),
    "csv": (csv_file, [], 4),
    "arrow": (arrow, [], 4),
    "save_to_disk": (saved, [], 4),
    "save_to_disk_dict": (saved_dict, ["--dataset-split", "more"], 4),
    "imagefolder": (imagefolder, [], 4),
    "hub_layout_shards": (hub_layout, [], 4),
    "hub_layout_config": (configs, ["--dataset-config", "colours"], 4),
}


@functools.lru_cache(maxsize=1)
def tiny_policy():
    from vlm_grpo.adapters.registry import family_class

    return family_class("smolvlm").tiny(seed=0)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_trains_two_steps(tmp_path, layout):
    write, extra, n_rows = LAYOUTS[layout]
    source = write(tmp_path)
    out = tmp_path / "run"
    cfg, recipe = load_recipe_config(None, ["--dataset", source, *extra, "--output-dir", str(out), *FAST])
    trainer = GRPOTrainer.from_settings(cfg, recipe=recipe, adapter=tiny_policy())
    assert len(trainer.train_dataset) == n_rows
    first = trainer.train_dataset[0]
    assert len(first.images) == 1 and first.images[0].getpixel((28, 28)) == (255, 0, 0)  # row 0: the red one
    history = trained(trainer)
    assert [m["step"] for m in history] == [1, 2]
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2] and (out / "final").is_dir()


def test_the_split_and_configuration_choose_the_rows(tmp_path):
    dict_folder, config_folder = saved_dict(tmp_path), configs(tmp_path)
    assert len(build(path=dict_folder)) == 1 and len(build(path=dict_folder, split="more")) == 4
    assert len(build(path=config_folder, dataset_config="small")) == 2
    assert len(build(path=config_folder, dataset_config="colours")) == 4
    with pytest.raises(ValueError, match=r"dict: no split 'test' \(splits: train, more\); set data.dataset_split \(training\)"):
        build(path=dict_folder, split="test")
    with pytest.raises(ValueError, match="data.dataset_config 'small' names a configuration, and this source has none"):
        build(path=parquet(tmp_path), dataset_config="small")


def test_rows_read_by_datasets_are_still_checked_and_skippable(tmp_path):
    import datasets

    good = rows(lambda i: {"bytes": png_bytes(i), "path": None})
    bad = {"prompt": "No picture here?", "image": {"bytes": b"not an image", "path": None}, "solution": "none"}
    data = datasets.Dataset.from_list([good[0], bad, good[1]]).cast_column("image", datasets.Image())
    data.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"saved: row 1: field 'image' is not a readable image"):
        build(path=str(tmp_path / "saved"))
    kept = build(path=str(tmp_path / "saved"), on_bad_sample="skip")
    assert len(kept) == 2 and list(kept.skipped_rows) == [1]


def test_rows_in_memory_are_read_as_they_are(tmp_path):
    from vlm_grpo.recipes.readers import InMemoryRows

    data = as_dataset()
    assert len(build(rows=InMemoryRows(data, "train_dataset"))) == 4
    assert len(build(rows=data.to_iterable_dataset(), size=3)) == 3
    listed = rows(lambda i: {"bytes": png_bytes(i), "path": None})
    listed[2]["prompt"] = 7
    with pytest.raises(ValueError, match=r"train_dataset: row 2: field 'prompt' must be a string"):
        build(rows=InMemoryRows(listed, "train_dataset"))
