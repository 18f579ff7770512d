"""trl: TRL-format rows (string or chat-message prompts, image or images columns, any other columns) from files or
a streamed hub split; configurable column names; bad rows named; a short run with TRL's own reward functions."""

from __future__ import annotations

import math

import pytest

from tests.recipes.helpers import png_bytes, save_image, write_jsonl, write_parquet
from vlm_grpo.recipes.rows import ImageRef
from vlm_grpo.recipes.trl_format import build
from tests.trained import trained

SYSTEM = {"role": "system", "content": "Think inside <think></think>, then answer."}


def chat(text: str, images: int = 1) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": text}]}]


def rows(folder) -> list[dict]:
    for i in range(3):
        save_image(folder / f"{i}.png", i)
    return [
        {"prompt": chat("What colour is the square?"), "image": "0.png", "solution": "red", "level": 1},
        {"prompt": "Which square is larger?", "images": ["1.png", "2.png"], "solution": "neither", "level": 2},
        {"prompt": [{"role": "user", "content": "Name the colour."}], "image": "2.png", "solution": "blue", "level": 3},
        {"prompt": "Say hello.", "solution": "hello", "level": 4},  # no image: a text-only row beside the others
    ]


@pytest.fixture
def data(tmp_path):
    return write_jsonl(tmp_path / "my.jsonl", rows(tmp_path))


def test_rows_become_prompts_images_and_reward_fields(data):
    ds = build(path=str(data))
    assert len(ds) == 4
    first, two, strings, text_only = (ds[i] for i in range(4))
    # chat messages kept as written (the system turn too), string contents as text parts
    assert first.prompt == [{"role": "system", "content": [{"type": "text", "text": SYSTEM["content"]}]},
                            *chat("What colour is the square?")[1:]]
    assert first.data_prompt == chat("What colour is the square?") and len(first.images) == 1
    assert first.fields["solution"] == "red" and first.fields["level"] == 1 and first.fields["image"] is first.images[0]
    assert "prompt" not in first.fields
    # a string prompt: one user turn, the images first
    assert two.prompt == [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                        {"type": "text", "text": "Which square is larger?"}]}]
    assert two.data_prompt == "Which square is larger?" and len(two.images) == 2 and two.fields["images"] == two.images
    assert two.images[1].getpixel((28, 28)) == (0, 0, 255)  # 2.png: blue, in the row's order
    # all-string messages: the images go before the first user turn's text, as TRL places them
    assert strings.prompt == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Name the colour."}]}]
    assert text_only.images == [] and text_only.prompt == [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]


def test_column_names_are_settings_and_the_answer_also_reaches_rewards_as_solution(tmp_path):
    save_image(tmp_path / "a.png", 0)
    path = write_jsonl(tmp_path / "rows.jsonl", [{"question": "Colour?", "img": "a.png", "answer": "red", "image": 5}])
    s = build(path=str(path), prompt_key="question", image_key="img", answer_key="answer")[0]
    assert s.prompt[0]["content"][-1]["text"] == "Colour?" and len(s.images) == 1
    assert s.fields["answer"] == "red" and s.fields["solution"] == "red" and s.fields["image"] == 5
    with pytest.raises(ValueError, match=r"rows.jsonl: row 0: field 'prompt' is missing \(set prompt_key"):
        build(path=str(path))


def test_parquet_with_image_bytes(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", [
        {"prompt": "Colour?", "images": [{"bytes": png_bytes(1), "path": None}, {"bytes": png_bytes(2), "path": None}],
         "solution": "green"},
    ])
    s = build(path=str(tmp_path))[0]
    assert len(s.images) == 2 and s.images[0].getpixel((28, 28)) == (0, 128, 0)


BAD = [
    ({"solution": "x"}, "prompt", "is missing"),
    ({"prompt": 3}, "prompt", "must be a string or a list of chat messages, got int"),
    ({"prompt": "  "}, "prompt", "is empty"),
    ({"prompt": []}, "prompt", "is an empty list of messages"),
    ({"prompt": [{"role": "robot", "content": "hi"}]}, "prompt", "message 0 has role 'robot'"),
    ({"prompt": [{"role": "user", "content": [{"type": "audio"}]}]}, "prompt", "message 0 part 0 has type 'audio'"),
    ({"prompt": [{"role": "user", "content": [{"type": "video"}]}]}, "prompt", "has 1 video parts but the row has 0 videos"),
    ({"prompt": chat("Two?", images=2), "image": "0.png"}, "prompt", r"has 2 image parts but the row has 1 images \(field 'image'\)"),
    ({"prompt": chat("None?"), "images": []}, "prompt", "has 1 image parts but the row has 0 images"),
    ({"prompt": "Colour?", "images": ["0.png", "missing.png"]}, r"images\[1\]", "names an image file that does not exist"),
    ({"prompt": "Colour?", "image": 12}, "image", "must be an image, bytes or a file path"),
    ({"prompt": "Colour?", "completions": "x"}, "completions", "has the name of an argument every reward receives"),
    ({"prompt": [{"role": "user", "content": [{"type": "image", "image": "0.png"}, {"type": "text", "text": "a"}]}],
      "image": "0.png"}, "prompt", "message 0 part 0 carries its image inline"),
]


@pytest.mark.parametrize("row, field, problem", BAD, ids=[b[2][:30] for b in BAD])
def test_a_bad_row_names_source_row_and_field(tmp_path, row, field, problem):
    save_image(tmp_path / "0.png", 0)
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Fine.", "image": "0.png"}, row])
    with pytest.raises(ValueError, match=rf"d.jsonl: row 1: field '{field}' {problem}"):
        build(path=str(path))


def test_bad_rows_are_skipped_when_asked(data, tmp_path):
    good = data.read_text()
    path = tmp_path / "mixed.jsonl"
    path.write_text(good + '{"prompt": 3}\n{"not json\n' + good)
    ds = build(path=str(path), on_bad_sample="skip")
    assert len(ds) == 8 and sorted(ds.skipped_rows) == [4, 5]
    with pytest.raises(ValueError, match="answer_key names it"):
        build(path=str(data), answer_key="gold")


def test_a_hub_split_is_streamed_and_its_images_stay_encoded(monkeypatch):
    import datasets

    read, calls = [], []

    def generate():
        for i in range(50):
            read.append(i)
            yield {"prompt": f"Colour {i}?", "image": {"bytes": png_bytes(i), "path": None}, "solution": "red"}

    features = datasets.Features({"prompt": datasets.Value("string"), "image": datasets.Image(),
                                  "solution": datasets.Value("string")})

    def fake_load_dataset(name, split, streaming=False):
        calls.append((name, split, streaming))
        return datasets.IterableDataset.from_generator(generate, features=features)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = build(hub_id="someone/colours", split="train", size=3)
    assert calls == [("someone/colours", "train", True)] and len(ds) == 3
    assert len(read) < 50  # only the rows taken (plus a read-ahead) were produced
    ref = ds.records[0]["images"][0]
    assert isinstance(ref, ImageRef) and ref.image is None and ref.data is not None  # bytes kept, decoded on access
    assert ds[2].images[0].getpixel((28, 28)) == (0, 0, 255) and ds[2].prompt[0]["content"][-1]["text"] == "Colour 2?"


def test_a_run_scores_with_trl_reward_functions(tmp_path):
    """Two GRPO steps on TRL-format rows; TRL's rewards read message completions, None is NaN and left out."""
    from vlm_grpo.grpo.run.logs import read_jsonl
    from vlm_grpo.grpo.settings.sources import load_recipe_config
    from vlm_grpo.api.trainers import GRPOTrainer

    save_image(tmp_path / "0.png", 0)
    data = write_jsonl(tmp_path / "my.jsonl", [
        {"prompt": chat("What is half of one?"), "image": "0.png", "answer": "$\\frac{1}{2}$"},
        {"prompt": chat("Which colour?"), "image": "0.png", "answer": "red"},  # no maths: accuracy_reward says None
    ])
    cfg, recipe = load_recipe_config(overrides=[
        "--model", "tiny:qwen2_5_vl", "--dataset", str(data), "--answer-key", "answer", "--max-steps", "2",
        "--reward", "trl.rewards:think_format_reward", "--reward", "trl.rewards:accuracy_reward",
        "--reward", "steps=tests.grpo.toy_rewards:record_steps", "--reward-weights", "1,2,0",
        "--batch-size", "2", "--num-generations", "2", "--max-new-tokens", "6", "--output-dir", str(tmp_path / "run"),
        "--logging.progress", "false", "--seed", "1",
        "--audit-at-start", "false",  # the reward audit would call the rewards before the first step too
    ])
    assert recipe.name == "trl"
    from tests.grpo import toy_rewards

    toy_rewards.STEPS.clear()
    history = trained(GRPOTrainer.from_settings(cfg, recipe=recipe))
    assert toy_rewards.STEPS == [0, 1]  # trainer_state.global_step: steps done before this one
    rows = read_jsonl(tmp_path / "run" / "completions.jsonl")
    by_prompt = {r["sample_index"]: r for r in rows}
    assert len(rows) == 8 and set(by_prompt) == {0, 1}
    colour = [r for r in rows if r["sample_index"] == 1]
    assert all(math.isnan(r["rewards"]["accuracy_reward"]) for r in colour)
    assert all(r["reward"] == r["rewards"]["think_format_reward"] for r in colour)  # the NaN is left out of the sum
    assert all(r["rewards"]["accuracy_reward"] in (0.0, 1.0) for r in rows if r["sample_index"] == 0)
    assert all(r["extra"]["gold_parsed"] == "[unparseable]" for r in colour)  # accuracy_reward's log_extra column
    for metrics in history:  # means over the completions the reward applies to: finite, half the rows count
        assert math.isfinite(metrics["rewards/accuracy_reward"]) and math.isfinite(metrics["reward"])
