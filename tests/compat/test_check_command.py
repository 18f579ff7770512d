"""`vlm-grpo check`: the pre-flight checks pass on every family and each failure is named; train runs the cheap ones."""

from __future__ import annotations

from tests.conftest import tiny_adapter
from vlm_grpo.cli import main
from vlm_grpo.grpo.training.preflight import cheap_checks
from vlm_grpo.recipes import get_recipe

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "6"]


def test_check_passes_on_every_family(family, capsys):
    assert main(["check", "--model", f"tiny:{family}", *FAST]) == 0
    out = capsys.readouterr().out
    assert "5 of 5 checks passed" in out and "left-padded batch = one by one" in out and "FAIL" not in out


def test_check_fails_a_sequence_that_cannot_fit(capsys):
    assert main(["check", "--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}",
                 "--max-new-tokens", "5000"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  sequence budget" in out and "above the model's 2048 positions" in out and "4 of 5 checks passed" in out


def test_cheap_checks_name_what_is_wrong():
    adapter = type(tiny_adapter("qwen2_5_vl")).tiny(seed=0)
    samples = [get_recipe("shapes").build(size=2, image_size=56)[i] for i in range(2)]
    assert all(f.ok for f in cheap_checks(adapter, samples, 8))
    adapter.suppressed_token_ids = lambda: [adapter.eos_token_ids[0], adapter.image_token_id]
    (bad,) = [f for f in cheap_checks(adapter, samples, 8) if not f.ok]
    assert bad.check == "suppressed ids" and "could never stop" in bad.detail
    samples[1].images.append(samples[1].images[0])  # two images, one image part in the prompt
    bad = [f for f in cheap_checks(adapter, samples, 8) if not f.ok]
    assert bad[0].check == "image tokens = image features" and "sample 1" in bad[0].detail


def test_train_runs_the_cheap_checks_before_training(tmp_path, capsys):
    code = main(["train", "--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens",
                 "5000", "--output-dir", str(tmp_path / "run"), "--logging.progress", "false"])
    assert code == 1
    assert "pre-flight check failed: sequence budget" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_sequence_budget_names_the_row_and_speaks_of_images_only_where_the_row_has_them():
    from vlm_grpo.recipes.base import Sample, user_turn
    from vlm_grpo.recipes.checked import CheckedSource
    from vlm_grpo.grpo.training.preflight import check_drawn_sample, row_names

    text = type(tiny_adapter("causal_lm")).tiny(seed=0)
    row = Sample(prompt=user_turn("What is two plus two?", n_images=0), images=[])
    (budget,) = [f for f in cheap_checks(text, [row], 5000, ["data.jsonl: row 7"]) if f.check == "sequence budget"]
    assert not budget.ok and budget.detail.startswith("data.jsonl: row 7: prompt takes ")
    assert "generation.max_new_tokens" in budget.detail and "image" not in budget.detail
    try:
        check_drawn_sample(text, row, 5000)
    except ValueError as err:
        assert "image" not in str(err) and "lower generation.max_new_tokens" in str(err)
    else:
        raise AssertionError("a row past the model's positions passed")
    adapter = type(tiny_adapter("qwen2_5_vl")).tiny(seed=0)
    shapes = CheckedSource(get_recipe("shapes").build(size=2, image_size=56))
    names = row_names(shapes, "shapes", 2)
    assert names == ["recipe shapes: row 0", "recipe shapes: row 1"]
    (budget,) = [f for f in cheap_checks(adapter, [shapes[0], shapes[1]], 5000, names) if f.check == "sequence budget"]
    assert budget.detail.startswith("recipe shapes: row ") and "with its 1 image" in budget.detail
    assert "data.recipe_options {image_size: N}" in budget.detail
