"""A hub dataset's image paths resolve only inside that dataset (or image_root): a row naming a local file outside
it is a named bad row, never read; a local dataset keeps reading the paths it names."""

from __future__ import annotations

import pytest

from tests.recipes.helpers import save_image, write_jsonl
from vlm_grpo.recipes.rows import path_in_dataset
from vlm_grpo.recipes.trl_format import build

HUB_ID = "someone/colours"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_rows(monkeypatch):
    """`build(hub_id=HUB_ID)` streams the rows put in the returned list (the hub is unreachable in tests)."""
    import datasets

    rows: list[dict] = []

    def fake_load_dataset(name, split, streaming=False):
        assert name == HUB_ID and streaming
        return datasets.Dataset.from_list(rows).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return rows


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A hub cache holding HUB_ID's `images/0.png` (red) at COMMIT, as huggingface_hub lays one out."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / f"datasets--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    save_image(repo / "snapshots" / COMMIT / "images" / "0.png", 0)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo


def row(image) -> dict:
    return {"prompt": "Which colour?", "image": image, "solution": "red"}


@pytest.mark.parametrize("kind", ["absolute", "dot-dot", "home", "other repo", "url", "windows drive"])
def test_a_hub_row_naming_a_file_outside_the_dataset_is_a_named_bad_row(tmp_path, hub_rows, hub_cache, kind):
    private = save_image(tmp_path / "private" / "secret.png", 2)  # a real, readable image on this machine
    value = {
        "absolute": str(private),
        "dot-dot": "images/../../../private/secret.png",
        "home": "~/secret.png",
        "other repo": "hf://datasets/someone/other/images/0.png",
        "url": "https://example.com/0.png",
        "windows drive": "C:\\private\\secret.png",
    }[kind]
    hub_rows += [row("images/0.png"), row(value)]
    with pytest.raises(ValueError) as err:
        build(hub_id=HUB_ID)
    assert str(err.value).startswith(f"{HUB_ID}: row 1: field 'image' names {value!r}, outside the hub dataset {HUB_ID}")
    # skip mode: the bad row is left out, the good one kept
    ds = build(hub_id=HUB_ID, on_bad_sample="skip")
    assert len(ds) == 1 and list(ds.skipped_rows) == [1]


def test_a_hub_rows_paths_inside_the_dataset_are_its_own_files(hub_rows, hub_cache):
    hub_rows += [row("images/0.png"), row(f"hf://datasets/{HUB_ID}@{COMMIT}/images/0.png"), row("./images/0.png")]
    ds = build(hub_id=HUB_ID)
    cached = (hub_cache / "snapshots" / COMMIT / "images" / "0.png").resolve()
    assert [ref.path.resolve() for record in ds.records for ref in record["images"]] == [cached] * 3
    assert ds[1].images[0].getpixel((28, 28)) == (255, 0, 0)


def test_a_hub_file_that_is_not_there_is_a_named_bad_row(hub_rows, hub_cache):
    hub_rows += [row("images/missing.png")]
    with pytest.raises(ValueError, match=rf"row 0: field 'image' names images/missing.png, which cannot be read "
                                         rf"from the hub dataset {HUB_ID}"):
        build(hub_id=HUB_ID)


def test_with_image_root_a_hub_rows_paths_stay_inside_it(tmp_path, hub_rows):
    root = tmp_path / "root"
    save_image(root / "0.png", 1)
    save_image(tmp_path / "outside.png", 2)
    (root / "link.png").symlink_to(tmp_path / "outside.png")  # a path inside that leads outside
    hub_rows += [row("0.png")]
    assert build(hub_id=HUB_ID, image_root=str(root))[0].images[0].getpixel((28, 28)) == (0, 128, 0)
    for escape, problem in [("../outside.png", "outside the hub dataset"), ("link.png", "inside image_root")]:
        hub_rows[:] = [row(escape)]
        with pytest.raises(ValueError, match=f"row 0: field 'image' .*{problem}"):
            build(hub_id=HUB_ID, image_root=str(root))


def test_a_local_dataset_still_reads_the_paths_it_names(tmp_path):
    elsewhere = save_image(tmp_path / "elsewhere" / "0.png", 1)
    data = write_jsonl(tmp_path / "data" / "rows.jsonl", [row(str(elsewhere)), row("../elsewhere/0.png")])
    ds = build(path=str(data))
    assert [ds[i].images[0].getpixel((28, 28)) for i in range(2)] == [(0, 128, 0)] * 2


def test_path_in_dataset():
    assert path_in_dataset("a/./b.png", HUB_ID) == ("a/b.png", None)
    assert path_in_dataset(f"hf://datasets/{HUB_ID}@v1.0/a.png", HUB_ID) == ("a.png", "v1.0")
    assert path_in_dataset(f"hf://datasets/{HUB_ID}-evil/a.png", HUB_ID) is None  # a longer name is another repo
    assert path_in_dataset(f"hf://datasets/{HUB_ID}/", HUB_ID) is None
    assert path_in_dataset("..\\a.png", HUB_ID) is None
