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


def changed(text: str, change: str) -> str:
    """`text` with each top-level key that `change` gives replaced by `change`'s (an experiment file refuses a key
    written twice)."""
    keys = {line.split(":", 1)[0] for line in change.splitlines() if line and not line[0].isspace()}
    kept, skipping = [], False
    for line in text.splitlines():
        if line and not line[0].isspace():
            skipping = line.split(":", 1)[0] in keys
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n" + change.replace("{", "{{").replace("}", "}}") + "\n"


def write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text).format(out=tmp_path / "runs"))
    return path


def test_a_good_config_and_overrides(tmp_path):
    exp = read_experiment(write(tmp_path, GOOD), ["grpo.max_steps=5", "grpo.loss.beta=0.1", "eval.size=9"])
    assert exp.stages["grpo"]["max_steps"] == 5 and exp.stages["grpo"]["loss"] == {"beta": 0.1}
    assert exp.eval["size"] == 9 and exp.stages["sft"]["max_steps"] == 2
    assert exp.stage_dir("align", 3) == exp.stage_dir("align", 4) == tmp_path / "runs" / "base-seed0" / "align"  # shared
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
    ("arms: {rft2: {method: star}}", "arms.rft2: an arm is a mapping with method (grpo, answer_sft, rft, sft_more)"),
    ("arms: {rft: {method: rft, steps: 3}}", "arms.rft: an arm is a mapping with method"),
    ("arms: {rft: [rft]}", "arms.rft: an arm is a mapping with method"),
    ("arms: {grpo: {method: grpo}}", "arms: 'grpo' is not a usable name"),
    ("arms: {Long Run: {method: grpo}}", "arms: 'Long Run' is not a usable name"),
    ("arms: {long: {method: grpo, set: [1]}}", "arms.long.set must be a mapping"),
    ("arms: {long: {method: grpo, set: {seed: 3}}}", "arms.long.set: the seed, resuming, the model"),
    ("arms: {long: {method: grpo, set: {model: {init_from: x}}}}", "arms.long.set: the seed, resuming, the model"),
    ("arms: {long: {method: grpo, set: {logging: {output_dir: x}}}}", "arms.long.set: the seed, resuming, the model"),
    ("arms: {long: {method: grpo, question_types: [kind]}}", "arms.long.question_types: a non-empty list"),
    ("arms: {shape: {method: answer_sft, question_types: kind}}", "arms.shape.question_types: a non-empty list"),
    ("arms: {shape: {method: answer_sft, question_types: []}}", "arms.shape.question_types: a non-empty list"),
    ("arms: [rft]", "arms must be a mapping"),
    ("independent_seeds: yes please", "independent_seeds must be true or false"),
    ("eval: {splits: [val, test], test_splits: [test]}", "['test'] are in both splits"),
    ("eval: {splits: val}", "eval.splits must be a list of split names"),
    ("eval: {test_splits: [1]}", "eval.test_splits must be a list of split names"),
    ("eval: {samples: true}", "eval.samples must be a whole number >= 0, got True"),
    ("base_seed: '3'", "base_seed must be a whole number >= 0, got '3'"),
])
def test_bad_configs_name_the_file_and_the_key(tmp_path, change, message):
    path = write(tmp_path, changed(GOOD, change))
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


@pytest.mark.parametrize("change,message", [
    ("grpo: {data: {recipe: scene_count}, optim: {lerning_rate: 0.1}}", "grpo (seed 0): setting 'optim.lerning_rate': unknown"),
    ("arms: {hot: {method: grpo, set: {generation: {temperature: 0}}}}", "hot (seed 0): setting 'generation.temperature'"),
    ("arms: {more: {method: sft_more, set: {max_steps: -1}}}", "more (seed 0): setting 'max_steps'"),
    ("eval: {splits: [test, tset], size: 4}", "eval on split 'tset' (seed 0): scene_count split 'tset'"),
    ("eval: {splits: [test], test_splits: [odd], size: 4}", "eval on split 'odd'"),
    ("eval: {splits: [test], size: many}", "eval on split 'test' (seed 0): eval.size: 'many' is not a valid int"),
    ("eval: {splits: [test], size: 4, dtype: float33}", "eval.dtype: 'float33' is not one of"),
    ("eval: {splits: [test], size: 4, max_new_tokens: 0}", "eval.max_new_tokens: 0 is out of range"),
])
def test_a_late_stage_setting_is_refused_before_the_first_stage_runs(tmp_path, capsys, change, message):
    """Each stage's settings (the arms' and every eval split's too) load before compose starts: a wrong one is named
    in seconds, not after the hours of the stages before it, and nothing is written."""
    path = write(tmp_path, changed(GOOD, change))
    assert main(["experiment", str(path), "--seed", "0"]) != 0
    err = capsys.readouterr().err
    assert message in err and str(path) in err
    assert not (tmp_path / "runs").exists()


def test_a_seed_no_stage_can_take_is_refused_before_the_first_stage_runs(tmp_path, capsys):
    assert main(["experiment", str(write(tmp_path, GOOD)), "--seed", "0", "-1"]) != 0
    assert "sft (seed -1): setting 'seed': -1 is out of range" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_eval_settings_keep_the_values_as_written(tmp_path):
    """An eval value reaches the report's settings as written, and their checks read it (a quoted "false" is off, not
    Python's bool of a non-empty string)."""
    from vlm_grpo.experiment.stages import eval_settings
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    exp = read_experiment(write(tmp_path, changed(GOOD, 'eval: {splits: [test], size: 4, image_reliance: "false"}')))
    cfg, _ = load_recipe_config(settings=eval_settings(exp, "grpo", "test", 0))
    assert cfg.eval.image_reliance is False and cfg.eval.size == 4


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


ARMS = GOOD + """
arms: {{shape: {{method: answer_sft, question_types: [kind]}}, rft: {{method: rft}}, more: {{method: sft_more}},
        hot: {{method: grpo, set: {{generation: {{temperature: 1.5}}, max_steps: 4}}}}}}
"""


def test_arms_are_stages_from_the_sft_checkpoint_on_grpo_prompts(tmp_path):
    """Each arm runs after grpo, starts from SFT's final model, and copies the stage it varies; GRPO draws its prompts
    in an order of its own (not SFT's rows again), which its variants and sft_more share."""
    from vlm_grpo.experiment.stages import stage_settings

    exp = read_experiment(write(tmp_path, ARMS), [])
    assert exp.stage_names() == ("compose", "align", "sft", "grpo", "shape", "rft", "more", "hot", "eval")
    assert exp.models() == ("base", "sft", "grpo", "shape", "rft", "more", "hot")
    sft_final = str(exp.stage_dir("sft", 2) / "final")
    settings = {name: stage_settings(exp, name, 2) for name in exp.stage_names()[2:-1]}
    for name in ("grpo", "shape", "rft", "more", "hot"):
        assert settings[name]["model"]["init_from"] == sft_final, name
        assert settings[name]["logging"]["output_dir"] == str(tmp_path / "runs" / "seed2" / name)
    hot = settings["hot"]
    assert hot["max_steps"] == 4 and hot["generation"] == {"temperature": 1.5} and hot["data"]["recipe"] == "scene_count"
    orders = {name: (s.get("data") or {}).get("data_seed") for name, s in settings.items()}
    assert orders["sft"] is None and orders["grpo"] not in (None, 2)
    assert orders["hot"] == orders["more"] == orders["grpo"] and orders["shape"] is None
    # a data order the stage sets itself is kept
    own = read_experiment(write(tmp_path, ARMS), ["grpo.data.data_seed=11"])
    assert stage_settings(own, "grpo", 2)["data"]["data_seed"] == 11


def test_independent_seeds_compose_and_align_their_own_base(tmp_path):
    from vlm_grpo.experiment.stages import composed_model, report_path, stage_settings

    exp = read_experiment(write(tmp_path, GOOD), ["independent_seeds=true"])
    assert exp.stage_dir("compose", 3) == tmp_path / "runs" / "base-seed3" / "compose"
    assert exp.stage_dir("align", 4) == tmp_path / "runs" / "base-seed4" / "align"
    assert stage_settings(exp, "align", 3)["seed"] == 3
    assert composed_model(exp, 4).endswith("base-seed4/compose/model")
    assert report_path(exp, "base", "val", 4).parent == tmp_path / "runs" / "base-seed4" / "eval"
    shared = read_experiment(write(tmp_path, GOOD), [])
    assert stage_settings(shared, "align", 3)["seed"] == 0 and composed_model(shared, 4).endswith("base-seed0/compose/model")


def test_grpo_prompts_are_not_the_sft_rows_again():
    """With the example's sizes (1,000,000 rows; SFT 100 x 16, GRPO 100 x 8), the two stages' orders share almost no
    row: the rows GRPO trains on are new to the model."""
    from vlm_grpo.experiment.stages import GRPO_ORDER
    from vlm_grpo.grpo.data.order import batch_indices

    for seed in (0, 1, 2):
        sft = {i for step in range(100) for i in batch_indices(1_000_000, 16, step, seed)}
        grpo = {i for step in range(100) for i in batch_indices(1_000_000, 8, step, seed + GRPO_ORDER)}
        assert len(grpo) == 800 and len(sft & grpo) <= 8
