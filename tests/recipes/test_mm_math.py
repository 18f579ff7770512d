"""mm_math: multimodal-open-r1-8k-verified rows; math-verify accuracy with a string fallback; the walkthrough's format."""

import pytest

from tests.recipes.helpers import png_bytes, same_sample, save_image, smoke_train, write_jsonl, write_parquet
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.mm_math import accuracy, build, format_reward

pytest.importorskip("math_verify")


def hub_rows(n=3):
    return [
        {
            "image": {"bytes": png_bytes(i), "path": f"{i}.png"},
            "problem": f"Based on the image, what is the sine of angle {i}?",
            "solution": "<think>sin 30 is a half.</think><answer>$\\frac{1}{2}$</answer>" if i == 0 else "B",
            "original_question": "q",
            "original_answer": "a",
        }
        for i in range(n)
    ]


@pytest.fixture
def folder(tmp_path):
    write_parquet(tmp_path / "mm" / "data" / "train-00000-of-00001.parquet", hub_rows())
    return tmp_path / "mm"


def test_rows_become_system_and_user_turns(folder):
    ds = build(path=str(folder))
    assert len(ds) == 3
    s = ds[0]
    assert s.prompt[0]["role"] == "system" and "<think>" in s.prompt[0]["content"] and "<answer>" in s.prompt[0]["content"]
    question = "Based on the image, what is the sine of angle 0?"
    assert s.prompt[1]["content"] == [{"type": "image"}, {"type": "text", "text": question}]
    assert s.fields == {"solution": "<think>sin 30 is a half.</think><answer>$\\frac{1}{2}$</answer>"}
    assert s.images[0].mode == "RGB" and s.reference is None
    a, b = build(path=str(folder)), build(path=str(folder))
    assert all(same_sample(a[i], b[i]) for i in range(3))


@pytest.mark.parametrize("reply, solution, expected", [
    ("<think>\n...\n</think>\n<answer>\n0.5\n</answer>", "$\\frac{1}{2}$", 1.0),
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>\\boxed{\\frac{2}{4}}</answer>", "<answer>\\frac{1}{2}</answer>", 1.0),
    ("<answer>\\frac{\\sqrt{3}}{2}</answer>", "$\\frac{\\sqrt{3}}{2}$", 1.0),
    ("<answer>$0.6$</answer>", "$\\frac{1}{2}$", 0.0),
    ("no answer at all", "$x+1$", 0.0),
    # not maths: normalized string match (case, spaces, trailing full stop, $ and \\boxed{})
    ("<answer> b. </answer>", "B", 1.0),
    ("<answer>\\boxed{B}</answer>", "B", 1.0),
    ("<answer>C</answer>", "B", 0.0),
    ("<answer>  New   York </answer>", "new york", 1.0),
    ("New York", "new york", 1.0),
])
def test_accuracy(reply, solution, expected):
    assert accuracy([reply], [solution]) == [expected]


def test_format_is_the_walkthroughs_layout():
    assert format_reward([
        "<think>\nsin 30 = 1/2\n</think>\n<answer>\n0.5\n</answer>",
        "<think>\na\n</think>\n<answer>\n0.5\n</answer>\nmore lines after",  # `$` matches at a line end
        "<think>a</think>\n<answer>0.5</answer>",  # tags not on their own lines
        "<think>\na\n</think><answer>\n0.5\n</answer>",
        "Sure.\n<think>\na\n</think>\n<answer>\n0.5\n</answer>",
    ]) == [1.0, 1.0, 0.0, 0.0, 0.0]
    recipe = get_recipe("mm_math")
    assert recipe.accuracy_reward == "accuracy" and [r.name for r in recipe.rewards] == ["format", "accuracy"]


@pytest.mark.parametrize("field, value, expected", [
    ("image", "broken.png", "is not a readable image"),
    ("image", None, "is missing"),
    ("problem", " ", "is empty"),
    ("problem", None, "is missing"),
    ("solution", ["B"], "must be a string, got list"),
])
def test_bad_row_names_row_and_field(tmp_path, field, value, expected):
    (tmp_path / "broken.png").write_bytes(b"this is text, not a PNG")
    rows = [{"image": str(save_image(tmp_path / f"{i}.png", i)), "problem": "What is x?", "solution": "3"} for i in range(3)]
    rows[1][field] = value
    write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError, match=rf"row 1: field '{field}' {expected}"):
        build(path=str(tmp_path))


def test_two_grpo_steps(folder, tmp_path):
    history = smoke_train("mm_math", tmp_path / "run", f"{{path: '{folder}', image_size: 56}}")
    assert len(history) == 2 and {"rewards/format", "rewards/accuracy"} <= set(history[-1])
