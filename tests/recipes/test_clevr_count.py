"""clevr_count: R1-style SFT rows (reference built from thinking + solution) and GRPO rows; 0.5/2.0 rewards."""

import pytest

from tests.recipes.helpers import png_bytes, same_sample, save_image, smoke_train, write_jsonl, write_parquet
from vlm_grpo.grpo.rewards.weighted import score
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.clevr_count import build, correctness, extract_answer, strict_format

PROBLEM = "How many items are there in the image?"


def sft_rows(n=3):
    # the hub layout: images as {"bytes", "path"} structs, tags already inside thinking and solution
    return [
        {
            "image": {"bytes": png_bytes(i), "path": None},
            "problem": PROBLEM,
            "thinking": f"<think> I count {i + 2} objects: cubes and spheres. </think>",
            "solution": f"<answer> {i + 2} </answer>",
        }
        for i in range(n)
    ]


def grpo_rows(folder, n=4):
    return [
        {
            "image": str(save_image(folder / "images" / f"{i}.png", i)),
            "problem": PROBLEM,
            "solution": f"<answer> {i + 1} </answer>",
        }
        for i in range(n)
    ]


@pytest.fixture
def sft_folder(tmp_path):
    write_parquet(tmp_path / "sft" / "data" / "train-00000-of-00001.parquet", sft_rows())
    return tmp_path / "sft"


def test_sft_rows_carry_the_reference(sft_folder):
    ds = build(path=str(sft_folder))
    assert len(ds) == 3
    s = ds[1]
    assert s.reference == "<think>I count 3 objects: cubes and spheres.</think>\n<answer>3</answer>"
    assert s.fields == {"answer": "3"}
    assert s.prompt[0]["role"] == "system" and "<think>" in s.prompt[0]["content"]
    assert s.prompt[1]["content"] == [{"type": "image"}, {"type": "text", "text": PROBLEM}]
    assert s.images[0].mode == "RGB"
    # the reference itself scores full marks
    assert strict_format([s.reference]) == [0.5] and correctness([s.reference], ["3"]) == [2.0]
    a, b = build(path=str(sft_folder)), build(path=str(sft_folder))
    assert all(same_sample(a[i], b[i]) for i in range(3))


def test_grpo_rows_have_no_reference(tmp_path):
    path = write_jsonl(tmp_path / "grpo.jsonl", grpo_rows(tmp_path))
    ds = build(path=str(path), size=3)
    assert len(ds) == 3 and ds[0].reference is None and ds[2].fields["answer"] == "3"
    with pytest.raises(ValueError, match=r"row 0: field 'thinking' is missing"):
        build(path=str(path), require_thinking=True)


def test_reward_values_follow_the_post():
    good = "<think>\nThere are 3 cubes.\n</think>\n<answer>3</answer>"
    assert strict_format([good]) == [0.5] and correctness([good], ["3"]) == [2.0]
    assert correctness(["<think>x</think>\n<answer> 3 </answer>"], ["3"]) == [2.0]  # trimmed
    assert correctness([good], ["4"]) == [0.0]
    assert strict_format([
        "<think>x</think> <answer>3</answer>",  # a space, not the newline
        "<think>x</think>\n<answer>3</answer>\n",  # trailing text
        "Sure! <think>x</think>\n<answer>3</answer>",  # leading text
        "<answer>3</answer>",
    ]) == [0.0, 0.0, 0.0, 0.0]
    assert extract_answer("<answer>2</answer> then <answer>5") == "5" and extract_answer("just 4") == "just 4"
    recipe = get_recipe("clevr_count")
    total, parts = score(recipe.rewards, [good, "<answer>3</answer>", "4"], {"answer": ["3", "3", "3"]})
    assert total.tolist() == [2.5, 2.0, 0.0] and parts["format"].tolist() == [0.5, 0.0, 0.0]
    assert recipe.accuracy_reward == "correctness"


@pytest.mark.parametrize("field, value, expected", [
    ("image", {"bytes": b"not an image", "path": None}, "is not a readable image"),
    ("image", 12, "must be an image, bytes or a file path"),
    ("problem", "", "is empty"),
    ("solution", None, "is missing"),
    ("solution", 3, "must be a string, got int"),
    ("solution", "<answer>  </answer>", "has an empty <answer>"),
    ("thinking", ["a", "list"], "must be a string"),
])
def test_bad_row_names_row_and_field(monkeypatch, field, value, expected):
    import datasets

    rows = sft_rows()
    rows[1][field] = value  # mixed column types cannot go through parquet: serve the rows as a hub set would
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split, streaming=False: rows)
    with pytest.raises(ValueError, match=rf"MMInstruction/Clevr_CoGenT_TrainA_R1: row 1: field '{field}' {expected}"):
        build(hub_id="MMInstruction/Clevr_CoGenT_TrainA_R1", size=0)


def test_two_grpo_steps(tmp_path):
    path = write_jsonl(tmp_path / "grpo.jsonl", grpo_rows(tmp_path))
    history = smoke_train("clevr_count", tmp_path / "run", f"{{path: '{path}'}}")
    assert len(history) == 2 and {"rewards/format", "rewards/correctness"} <= set(history[-1])
