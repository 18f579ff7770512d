"""vsr: the study's row schema from a folder, a file or a hub id; True/False (and Yes/No) accuracy; bad rows."""

import pytest

from tests.recipes.helpers import png_bytes, same_sample, save_image, smoke_train, write_jsonl
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.vsr import accuracy, build, format_reward


def vsr_rows(folder, n=4):
    rows = []
    for i in range(n):
        name = f"{i:012d}.jpg"
        full = save_image(folder / "images" / name, i)
        rows.append({
            # the study stores absolute paths; relative ones resolve against the folder (and images/)
            "image_path": str(full) if i == 0 else (f"images/{name}" if i % 2 else name),
            "caption": ["The cake is next to the person.", "The cat is under the table."][i % 2],
            "label": [1, 0, True, "false"][i % 4],
            "relation": ["next to", "under"][i % 2],
            "subj": ["cake", "cat"][i % 2],
            "obj": ["person", "table"][i % 2],
        })
    return rows


@pytest.fixture
def folder(tmp_path):
    write_jsonl(tmp_path / "vsr" / "train.jsonl", vsr_rows(tmp_path / "vsr"))
    return tmp_path / "vsr"


def test_folder_rows_become_the_studys_prompts(folder):
    ds = build(path=str(folder))
    assert len(ds) == 4
    s = ds[0]
    text = s.prompt[0]["content"][-1]["text"]
    assert text.startswith("Is the following statement true: The cake is next to the person.")
    assert "<think>" in text and "<answer>" in text and s.prompt[0]["content"][0] == {"type": "image"}
    assert [ds[i].fields["solution"] for i in range(4)] == ["True", "False", "True", "False"]
    assert s.fields["relation"] == "next to"
    assert s.images[0].mode == "RGB" and s.images[0].size == (56, 56)
    assert len(build(path=str(folder / "train.jsonl"), size=2)) == 2
    assert build(path=str(folder), image_size=28)[1].images[0].size == (28, 28)


def test_build_is_deterministic(folder):
    a, b = build(path=str(folder)), build(path=str(folder))
    assert all(same_sample(a[i], b[i]) for i in range(len(a)))


def test_hub_dataset_goes_through_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, split, streaming=False):
        calls.append((name, split, streaming))
        data = datasets.Dataset.from_list([
            {"image": png_bytes(i), "caption": "The dog is on the bed.", "label": i % 2,
             "relation": "on", "subj": "dog", "obj": "bed"}
            for i in range(3)
        ])
        return data.to_iterable_dataset() if streaming else data

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = build(split="validation", size=2, hub_id="someone/vsr")
    assert calls == [("someone/vsr", "validation", True)] and len(ds) == 2  # streamed: only the rows taken are read
    assert [ds[i].fields["solution"] for i in range(2)] == ["False", "True"]


def test_rewards_accept_true_false_and_yes_no():
    good = "<think>The cake is beside the person.</think>\n<answer>{}</answer>"
    replies = [good.format(a) for a in ("True", "yes", "No.", " FALSE ", "maybe")] + ["True"]
    solutions = ["True", "True", "False", "False", "True", "True"]
    assert accuracy(replies, solutions) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert accuracy([good.format("Yes")], ["False"]) == [0.0]
    assert format_reward(replies) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    wrong = ["<answer>True</answer><think>x</think>", "<think>x</think> <answer>True</answer> trailing"]
    assert format_reward(wrong) == [0.0, 0.0]
    recipe = get_recipe("vsr")
    assert recipe.accuracy_reward == "accuracy" and [r.name for r in recipe.rewards] == ["accuracy", "format"]


@pytest.mark.parametrize("field, value, expected", [
    ("caption", None, "is missing"),
    ("caption", 7, "must be a string"),
    ("caption", "   ", "is empty"),
    ("label", "maybe", "must be 1/0 or true/false"),
    ("image_path", "images/nowhere.jpg", "names an image file that does not exist"),
])
def test_bad_row_names_row_and_field(tmp_path, field, value, expected):
    rows = vsr_rows(tmp_path)
    rows[2][field] = value
    write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError, match=rf"row 2: field '{field}' {expected}"):
        build(path=str(tmp_path / "train.jsonl"))


def test_source_errors(tmp_path, folder):
    with pytest.raises(ValueError, match="exactly one of path"):
        build()
    with pytest.raises(ValueError, match="exactly one of path"):
        build(path=str(folder), hub_id="x/y")
    with pytest.raises(ValueError, match="does not exist"):
        build(path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('\nnot json\n{"caption": "a"}\n')  # rows are checked in file order
    with pytest.raises(ValueError, match=r"row 0 \(line 2\) is not valid JSON"):
        build(path=str(tmp_path / "bad.jsonl"))
    (tmp_path / "list.jsonl").write_text('["a row that is a list"]\n')
    with pytest.raises(ValueError, match="row 0 is a list"):
        build(path=str(tmp_path / "list.jsonl"))


def test_two_grpo_steps(folder, tmp_path):
    history = smoke_train("vsr", tmp_path / "run", f"{{path: '{folder}'}}")
    assert len(history) == 2 and {"rewards/accuracy", "rewards/format"} <= set(history[-1])
