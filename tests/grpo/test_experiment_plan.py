"""An experiment config is checked before anything runs: a wrong key, a missing LM, a setting the experiment owns,
or an unknown stage is refused with the file and the key named; `--set` overrides reach nested settings."""

from __future__ import annotations

import textwrap

import pytest

from vlm_grpo.cli import main
from vlm_grpo.experiment.plan import ExperimentError, read_experiment

GOOD = """
name: toy
output_dir: {out}
compose: {{llm: smollm2, tower: {{hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
          num_attention_heads: 2, image_size: 32, patch_size: 16}}}}
align: {{data: {{recipe: scene_count}}, max_steps: 2}}
sft: {{data: {{recipe: scene_count}}, max_steps: 2}}
grpo: {{data: {{recipe: scene_count}}, max_steps: 2}}
eval: {{splits: [test, ood], size: 4}}
"""


def write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text).format(out=tmp_path / "runs"))
    return path


def test_a_good_config_and_overrides(tmp_path):
    exp = read_experiment(write(tmp_path, GOOD), ["grpo.max_steps=5", "grpo.loss.beta=0.1", "eval.size=9"])
    assert exp.stages["grpo"]["max_steps"] == 5 and exp.stages["grpo"]["loss"] == {"beta": 0.1}
    assert exp.eval["size"] == 9 and exp.stages["sft"]["max_steps"] == 2
    assert exp.stage_dir("align", 3) == exp.base_dir() / "align"  # shared by every seed
    assert exp.stage_dir("grpo", 3) == tmp_path / "runs" / "seed3" / "grpo"
    pretrained = GOOD.replace("patch_size: 16}}", "patch_size: 16}}, tower_pretrain: {{steps: 2, batch_size: 2, "
                              "learning_rate: 0.001, counts: true}}")
    assert read_experiment(write(tmp_path, pretrained), []).compose["tower_pretrain"]["counts"] is True
    words = GOOD.replace("align: {{data: {{recipe: scene_count}}, max_steps: 2}}",
                         "align: {{data: {{recipe: scene_count}}, words: {{steps: 2, batch_size: 4, learning_rate: 0.001}}}}")
    assert read_experiment(write(tmp_path, words), []).stages["align"]["words"]["steps"] == 2


@pytest.mark.parametrize("change,message", [
    ("stages: {}", "unknown key(s) ['stages']"),
    ("compose: {llm: smollm2}", "exactly one of vision"),
    ("compose: {vision: /x, tower: {image_size: 32}, llm: smollm2}", "exactly one of vision"),
    ("compose: {tower: {image_size: 32}}", "compose.llm is required"),
    ("sft: {seed: 3}", "['seed'] are set by the experiment"),
    ("grpo: {model: {name: x}}", "model.name and model.init_from are set by the experiment"),
    ("sft: {model: {init_from: x, dtype: float32}}", "model.name and model.init_from are set by the experiment"),
    ("align: {logging: {output_dir: elsewhere}}", "logging.output_dir is set by the experiment"),
    ("eval: {splitz: [test]}", "eval: unknown key(s) ['splitz']"),
    ("compose: {vision: /x, llm: smollm2, tower_pretrain: {steps: 1, batch_size: 2, learning_rate: 0.1}}",
     "compose.tower_pretrain pretrains the random tower"),
    ("compose: {llm: smollm2, tower: {image_size: 32}, tower_pretrain: {steps: 1}}", "takes batch_size, learning_rate, steps, and optionally counts"),
    ("sft: [1, 2]", "sft must be a mapping"),
    ("align: {words: {steps: 1, batch_size: 2}}", "align.words trains the projector to the LM's words and takes exactly"),
    ("align: {words: {steps: 1, batch_size: 2, learning_rate: 0.1}, max_steps: 3}",
     "align with words takes only data, words"),
    ("align: {words: {steps: 0, batch_size: 2, learning_rate: 0.1}}", "steps and batch_size must be positive integers"),
    ("align: {words: {steps: 2.5, batch_size: 2, learning_rate: 0.1}}", "steps and batch_size must be positive integers"),
    ("align: {words: {steps: 2, batch_size: 2, learning_rate: -1}}", "learning_rate a positive number"),
    ("eval: {data: {recipe_options: {task: attribute}}}", "eval.data names the questions every model is asked"),
    ("eval: {data: {recipe: scene_count, size: 3}}", "eval.data names the questions every model is asked"),
    ("eval: {data: [scene_count]}", "eval.data names the questions every model is asked"),
    ("eval: {data: {recipe: scene_count, recipe_options: [task]}}", "eval.data.recipe_options must be a mapping"),
])
def test_bad_configs_name_the_file_and_the_key(tmp_path, change, message):
    path = write(tmp_path, GOOD + "\n" + change.replace("{", "{{").replace("}", "}}") + "\n")
    with pytest.raises(ExperimentError) as err:
        read_experiment(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_bad_overrides_and_stages_are_refused_on_the_command_line(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    with pytest.raises(ExperimentError, match="write KEY=VALUE"):
        read_experiment(path, ["grpo.max_steps"])
    with pytest.raises(ExperimentError, match="max_steps is a value, not a section"):
        read_experiment(path, ["grpo.max_steps.x=1"])
    assert main(["experiment", str(path), "--stages", "align,rl"]) != 0
    assert "unknown stage(s) ['rl']" in capsys.readouterr().err
    assert main(["experiment", str(tmp_path / "missing.yaml")]) != 0
    assert "does not exist" in capsys.readouterr().err


def test_summary_without_finished_seeds_says_what_to_run(tmp_path, capsys):
    assert main(["experiment", str(write(tmp_path, GOOD)), "--stages", "none", "--summary"]) != 0
    assert "no seed of toy has all its reports" in capsys.readouterr().err


def test_a_resumed_stage_counts_the_time_of_its_stopped_runs(tmp_path):
    import time

    from vlm_grpo.experiment.stages import done, mark_done, record_spent

    record_spent(tmp_path, time.time() - 30)  # a run stopped after 30 s
    record_spent(tmp_path, time.time() - 20)  # and another after 20 s
    mark_done(tmp_path, time.time() - 10)  # the run that finished took 10 s
    assert done(tmp_path)["seconds"] == pytest.approx(60, abs=1)


def test_eval_asks_the_grpo_stage_questions_unless_eval_names_its_own(tmp_path):
    """SFT may see part of the task (one kind of question): the models are all asked what GRPO trained on."""
    from vlm_grpo.experiment.stages import eval_settings

    partial = GOOD.replace("sft: {{data: {{recipe: scene_count}}", "sft: {{data: {{recipe: scene_count, recipe_options: {{task: attribute, asks: colour}}}}")
    partial = partial.replace("grpo: {{data: {{recipe: scene_count}}", "grpo: {{data: {{recipe: scene_count, recipe_options: {{task: attribute}}}}")
    exp = read_experiment(write(tmp_path, partial), [])
    for model in ("base", "sft", "grpo"):
        assert eval_settings(exp, model, "test", 0)["data"] == {"recipe": "scene_count", "recipe_options": {"task": "attribute"}}
    exp = read_experiment(write(tmp_path, partial), ["eval.data={recipe: scene_count, recipe_options: {task: count}}"])
    assert eval_settings(exp, "sft", "ood", 0)["data"] == {"recipe": "scene_count", "recipe_options": {"task": "count"}}
