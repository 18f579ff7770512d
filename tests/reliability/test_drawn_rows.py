"""Every row is checked when it is drawn, not only the first ones: too long for the model's positions, an aspect
ratio the processor rejects, an image that does not decode, a line that is not UTF-8, an image string that is
neither a path nor a data: URI. Each is named (source, row, what) and skippable. Data URIs and EXIF orientation are
read as datasets/transformers read them; a small dataset repeats evenly, with a note."""

from __future__ import annotations

import base64
import io
import json
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from tests.recipes.helpers import png_bytes, save_image
from vlm_grpo.cli import main
from vlm_grpo.grpo.data.order import batch_indices
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.recipes import trl_format

RUN = ["--model", "tiny:qwen2_5_vl", "--max-new-tokens", "4", "--logging.progress", "false", "--learning-rate", "1e-3",
       "--reward", "tests.reliability.step_rewards:lowercase", "--batch-size", "2"]
LONG_PROMPT = "Describe every detail of the picture. " * 400  # far above the tiny twin's 2048 positions
GOOD_URI = "data:image/png;base64," + base64.b64encode(png_bytes(2)).decode()
BAD = {  # kind: (the row, or raw line bytes; the message after "<file>: row 5")
    "positions": ({"prompt": LONG_PROMPT, "image": "ok0.png"},
                  r": prompt with its 1 image takes \d+ tokens; with generation.max_new_tokens 4 that is \d+, above the "
                  r"model's 2048 positions: use smaller images"),
    "aspect ratio": ({"prompt": "What is it?", "image": "tall.png"},
                     r": the model's processor rejects it: ValueError: absolute aspect ratio must be smaller than 200"),
    "undecodable": ({"prompt": "What is it?", "image": "cut.png"}, r": field 'image': cannot be decoded: image file "
                                                                  r"is truncated"),
    "not utf-8": (b'{"prompt": "caf\xe9?", "image": "ok0.png"}\n', r" \(line 6\) is not UTF-8 text: byte 0xe9 at "
                                                                   r"offset 15 \(save the file as UTF-8\)"),
    "not a path": ({"prompt": "What is it?", "image": "iVBORw0KGgo" * 900}, r": field 'image' is a string of 9900 "
                   r"characters starting 'iVBORw0KGgoiVBORw0KGgoiV': neither an image file path nor a data: URI"),
    "bad data uri": ({"prompt": "What is it?", "image": "data:image/png;base64,@@@@"},
                     r": field 'image' is a data: URI whose base64 does not decode"),
}


def _line(row) -> bytes:
    return row if isinstance(row, bytes) else (json.dumps(row) + "\n").encode()


@pytest.fixture
def folder(tmp_path):
    for i in range(4):
        save_image(tmp_path / f"ok{i}.png", i)
    Image.new("RGB", (2, 500), "red").save(tmp_path / "tall.png")  # 1:250
    whole = png_bytes(1, size=200)
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])  # the header reads, the pixels do not
    return tmp_path


def _write(folder, rows) -> str:
    path = folder / "my.jsonl"
    path.write_bytes(b"".join(_line(r) for r in rows))
    return str(path)


def _good(i):
    return {"prompt": f"What colour is square {i}?", "image": f"ok{i % 4}.png"}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_later_row_is_named_when_drawn(kind, folder, capsys):
    row, problem = BAD[kind]
    data = _write(folder, [_good(i) for i in range(5)] + [row])  # row 5: past the pre-flight's first samples
    code = main(["train", *RUN, "--dataset", data, "--max-steps", "3", "--output-dir", str(folder / "run")])
    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"vlm-grpo train: error: {data}: row 5")
    assert re.match(problem, last[len(f"vlm-grpo train: error: {data}: row 5"):]), last


def test_bad_rows_are_skipped_and_named_with_on_bad_sample_skip(folder, capsys):
    rows = [_good(0), BAD["positions"][0], _good(1), BAD["aspect ratio"][0], BAD["not utf-8"][0], _good(2),
            BAD["undecodable"][0], BAD["not a path"][0], {"prompt": "What colour?", "image": GOOD_URI},
            BAD["bad data uri"][0], _good(3)]
    data = _write(folder, rows)
    run = folder / "run"
    # 8 records survive loading; 4 steps of 2 draw all of them once (one epoch)
    assert main(["train", *RUN, "--dataset", data, "--max-steps", "4", "--on-bad-sample", "skip",
                 "--output-dir", str(run)]) == 0
    out = capsys.readouterr().out
    skipped = out[out.index("skipped 6 bad samples: "):].splitlines()[0]
    assert skipped == "skipped 6 bad samples: ['source row 4', 'source row 7', 'source row 9', 1, 3, 5]"
    assert read_jsonl(run / "metrics.jsonl")[-1]["skipped_samples"] == 6
    sampled = Counter(r["sample_index"] for r in read_jsonl(run / "completions.jsonl"))
    assert not {1, 3, 5} & set(sampled)  # the record indices (rows 1, 3, 6 of the file) skipped when drawn


def test_a_data_uri_image_is_the_image_it_encodes(folder):
    data = _write(folder, [{"prompt": "a", "image": GOOD_URI}, {"prompt": "b", "image": "ok2.png"}])
    samples = trl_format.build(path=data)
    assert np.array_equal(np.asarray(samples[0].images[0]), np.asarray(samples[1].images[0]))


def test_exif_orientation_is_applied_as_datasets_does(tmp_path):
    import datasets

    img = Image.new("RGB", (80, 40), "blue")
    img.paste("red", (0, 0, 40, 40))  # red on the left as stored; orientation 6 shows it on top
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif.tobytes(), quality=95)
    (tmp_path / "turned.jpg").write_bytes(buf.getvalue())
    data = _write(tmp_path, [{"prompt": "Is red above blue?", "image": "turned.jpg"}])
    ours = trl_format.build(path=data)[0].images[0]
    theirs = datasets.Image().decode_example({"path": None, "bytes": buf.getvalue()}).convert("RGB")
    assert ours.size == theirs.size == (40, 80)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    top, bottom = np.asarray(ours)[5, 20], np.asarray(ours)[75, 20]
    assert top[0] > 200 and top[2] < 60 and bottom[2] > 200  # red above blue, as the caption says


def test_a_small_dataset_repeats_evenly_with_a_note(folder, capsys):
    data = _write(folder, [_good(i) for i in range(3)])
    run = folder / "run"
    assert main(["train", *RUN, "--dataset", data, "--batch-size", "16", "--num-generations", "2", "--max-steps", "2",
                 "--output-dir", str(run)]) == 0
    assert ("note: the training set has 3 rows and a step draws 16 prompts: rows repeat within a step (about 5.3 "
            "times each), in whole shuffled passes (epochs), so over the run every row is drawn equally often, to "
            "within one") in capsys.readouterr().out
    rows = read_jsonl(run / "completions.jsonl")  # 2 completions per drawn prompt
    for step in (1, 2):
        drawn = Counter(batch_indices(3, 16, step - 1, seed=0))
        assert Counter(r["sample_index"] for r in rows if r["step"] == step) == Counter({i: 2 * n for i, n in drawn.items()})
    assert sorted(Counter(r["sample_index"] for r in rows).values()) == [20, 22, 22]  # 32 draws: 10, 11, 11
