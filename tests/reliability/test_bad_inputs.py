"""Bad input gets a clear error naming the row and field; skip mode skips and reports."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from PIL import Image

from tests.recipes.helpers import image, save_image, write_jsonl
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.images import BadImage, cap_pixels, prepare, to_rgb
from vlm_grpo.recipes import vsr
from vlm_grpo.recipes.base import Sample, user_turn
from vlm_grpo.recipes.checked import CheckedSource, validate_sample


def vsr_row(name: str, caption: str = "The cat is left of the dog.", label=1) -> dict:
    return {"image": name, "caption": caption, "label": label, "relation": "left of", "subj": "cat", "obj": "dog"}


@pytest.fixture
def folder(tmp_path):
    for i in range(4):
        save_image(tmp_path / "images" / f"ok{i}.png", i)
    (tmp_path / "images" / "text.png").write_bytes(b"this is not an image at all")
    good = (tmp_path / "images" / "ok0.png").read_bytes()
    (tmp_path / "images" / "truncated.png").write_bytes(good[: len(good) // 2])
    return tmp_path


def test_missing_image_file_names_row_and_field(folder):
    write_jsonl(folder / "train.jsonl", [vsr_row("ok0.png"), vsr_row("gone.png")])
    with pytest.raises(ValueError, match=r"row 1: field 'image' names an image file that does not exist"):
        vsr.build(path=str(folder / "train.jsonl"))


def test_non_image_bytes_name_row_and_field(folder):
    write_jsonl(folder / "train.jsonl", [vsr_row("ok0.png"), vsr_row("ok1.png"), vsr_row("text.png")])
    with pytest.raises(ValueError, match=r"row 2: field 'image' is not a readable image"):
        vsr.build(path=str(folder / "train.jsonl"))


def test_truncated_image_names_row_and_field_when_taken(folder):
    write_jsonl(folder / "train.jsonl", [vsr_row("ok0.png"), vsr_row("truncated.png")])
    data = vsr.build(path=str(folder / "train.jsonl"))  # the header is fine; the pixels are not
    assert data[0].images[0].size == (56, 56)
    with pytest.raises(ValueError, match=r"row 1: field 'image': cannot be decoded"):
        data[1]


def test_wrong_type_missing_field_and_empty_prompt(folder):
    write_jsonl(folder / "a.jsonl", [vsr_row("ok0.png"), vsr_row("ok1.png", label="maybe")])
    with pytest.raises(ValueError, match=r"row 1: field 'label'"):
        vsr.build(path=str(folder / "a.jsonl"))
    row = vsr_row("ok0.png")
    del row["caption"]
    write_jsonl(folder / "b.jsonl", [row])
    with pytest.raises(ValueError, match=r"row 0: field 'caption' is missing"):
        vsr.build(path=str(folder / "b.jsonl"))
    write_jsonl(folder / "c.jsonl", [vsr_row("ok0.png", caption="   ")])
    with pytest.raises(ValueError, match=r"row 0: field 'caption' is empty"):
        vsr.build(path=str(folder / "c.jsonl"))


def test_skip_mode_skips_and_reports(folder, caplog):
    rows = [vsr_row("ok0.png"), vsr_row("gone.png"), vsr_row("ok1.png"), vsr_row("text.png"), vsr_row("truncated.png")]
    write_jsonl(folder / "train.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        data = vsr.build(path=str(folder / "train.jsonl"), on_bad_sample="skip")
    assert len(data) == 3 and sorted(data.skipped_rows) == [1, 3]
    assert "skipped 2 bad rows" in caplog.text
    checked = CheckedSource(data, "skip")
    taken = [checked[i] for i in range(len(checked))]  # the truncated one is replaced by the next good one
    assert len(taken) == 3
    assert set(checked.skipped) == {"source row 1", "source row 3", 2}
    with pytest.raises(ValueError, match=r"train.jsonl: row 4: .*cannot be decoded"):  # the source's row, not the record's
        CheckedSource(data, "error")[2]


def test_a_bad_json_line_is_a_row_like_any_other(folder, caplog):
    rows = [vsr_row("ok0.png"), vsr_row("ok1.png", label="maybe"), vsr_row("ok2.png"), vsr_row("ok3.png")]
    lines = [__import__("json").dumps(r) for r in rows]
    lines.insert(3, '{"image": "ok2.png", "caption": ')  # a line cut short, between good rows
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"row 1: field 'label'"):  # the first bad row in file order
        vsr.build(path=str(folder / "train.jsonl"))
    with caplog.at_level(logging.WARNING):
        data = vsr.build(path=str(folder / "train.jsonl"), on_bad_sample="skip")
    assert len(data) == 3 and sorted(data.skipped_rows) == [1, 3]
    assert "line 4) is not valid JSON" in data.skipped_rows[3] and "skipped 2 bad rows" in caplog.text


def test_an_undecodable_parquet_row_is_a_bad_row(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([vsr_row("ok0.png"), vsr_row("ok1.png"), vsr_row("ok2.png")])
    # a timestamp past year 9999 is valid parquet that Python cannot hold: that row fails to decode
    table = table.append_column("taken", pa.array([0, 10**13, 0], type=pa.timestamp("s")))
    pq.write_table(table, folder / "train.parquet")
    with pytest.raises(ValueError, match=r"row 1 cannot be decoded: OverflowError"):
        vsr.build(path=str(folder / "train.parquet"))
    data = vsr.build(path=str(folder / "train.parquet"), on_bad_sample="skip")
    assert len(data) == 2 and list(data.skipped_rows) == [1]


def test_sample_level_checks_name_the_field():
    img = image(0)
    assert validate_sample(Sample(user_turn("How many?"), [img]), 0)
    with pytest.raises(ValueError, match=r"row 3: field 'prompt' has no text"):
        validate_sample(Sample(user_turn("  "), [img]), 3)
    with pytest.raises(ValueError, match=r"row 4: field 'images' holds 2 images but the prompt has 1 image parts"):
        validate_sample(Sample(user_turn("Count."), [img, img]), 4)
    with pytest.raises(ValueError, match=r"row 5: field 'images' must be a list of PIL images"):
        validate_sample(Sample(user_turn("Count."), ["cat.png"]), 5)


def _array(img):
    return np.asarray(img).astype(int)


def test_image_modes_become_rgb():
    gray = Image.new("L", (4, 4), 128)
    assert to_rgb(gray).mode == "RGB" and _array(to_rgb(gray))[0, 0].tolist() == [128, 128, 128]
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red -> the white background
    assert _array(to_rgb(rgba))[0, 0].tolist() == [255, 255, 255]
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    assert _array(to_rgb(palette))[0, 0].tolist() == [10, 200, 30]
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # cyan-free, full magenta+yellow = red
    assert _array(to_rgb(cmyk))[0, 0].tolist() == [255, 0, 0]
    deep = Image.fromarray(np.array([[0, 65535], [32768, 1000]], dtype=np.uint16))  # 16-bit: scaled, not clipped
    values = _array(to_rgb(deep))[..., 0]
    assert values[0, 0] == 0 and values[0, 1] == 255 and 120 < values[1, 0] < 135
    with pytest.raises(BadImage, match="zero size"):
        to_rgb(Image.new("RGB", (0, 5)))


def test_very_large_images_are_capped_and_logged(caplog):
    big = Image.new("RGB", (5000, 4000), "white")
    with caplog.at_level(logging.WARNING):
        capped = cap_pixels(big, max_pixels=4096 * 4096)
    assert capped.width * capped.height <= 4096 * 4096 and abs(capped.width / capped.height - 1.25) < 0.01
    assert "5000x4000" in caplog.text


def test_encode_prompts_names_the_bad_sample():
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    broken = io.BytesIO()
    image(0).save(broken, format="PNG")
    truncated = Image.open(io.BytesIO(broken.getvalue()[:60]))
    with pytest.raises(ValueError, match=r"sample 1: field 'images': the image cannot be decoded"):
        adapter.encode_prompts([user_turn("a"), user_turn("b")], [[image(0)], [truncated]])
    with pytest.raises(ValueError, match=r"sample 0: field 'images': the image has zero size"):
        prepare_check = adapter.encode_prompts([user_turn("a")], [[Image.new("RGB", (0, 0))]])  # noqa: F841
    rgba = Image.new("RGBA", (56, 56), (0, 0, 255, 128))
    assert adapter.encode_prompts([user_turn("a")], [[rgba]]).mm["pixel_values"].shape[0] > 0
    assert prepare(Image.new("LA", (3, 3))).mode == "RGB"
