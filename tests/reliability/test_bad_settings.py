"""Settings that cannot work are refused before any model loads: one line naming the setting, no traceback.
Settings TRL users type are honoured where they mean the same, and refused with the reason where not."""

from __future__ import annotations

import pytest

from vlm_grpo import loader
from vlm_grpo.cli import main
from vlm_grpo.grpo.algorithm.losses import LOSSES
from vlm_grpo.grpo.training import policy
from vlm_grpo.grpo.settings.sources import load_config

BAD = {
    "--loss_type grpoo": f"'loss.loss_type': 'grpoo' is not one of {', '.join(sorted(LOSSES))}",
    "--epsilon 5": "'loss.epsilon': 5.0 is out of range: it must be < 1.0",
    "--freeze visoin": "'optim.freeze': unknown module group(s) ['visoin']",
    "--lora.r -3": "'lora.r': -3 is out of range: it must be >= 0",
    "--model /nonexistent": "'model.name': no such directory or hub id: /nonexistent",
    "--init-from ./runs/none/final": "'model.init_from': no such directory or hub id: ./runs/none/final",
    "--model tiny:nope": "'model.name': unknown model family 'nope'",
    "--batch-size 0": "'data.batch_size': 0 is out of range: it must be >= 1",
    "--num-generations 1": "'data.num_generations': 1 is out of range: it must be >= 2",
    "--num-generations 0": "'data.num_generations': 0 is out of range: it must be >= 2",
    "--max-new-tokens 0": "'generation.max_new_tokens': 0 is out of range: it must be >= 1",
    "--temperature 0": "'generation.temperature': 0.0 is out of range: it must be > 0.0",
    "--batch-size 2 --gradient-accumulation-steps 3": "'gradient_accumulation_steps': 3 does not divide data.batch_size",
    "--mixed-precision fp8": "'mixed_precision': 'fp8' is not one of no, bf16, fp16",
    "--report-to neptune": "'logging.report_to': 'neptune' is not one of tensorboard, wandb, mlflow, trackio",
    "--per_device_train_batch_size 8": "TRL's per_device_train_batch_size has no same-meaning setting here",
    "--max_prompt_length 64": "prompts are never cut: an image's tokens must stay whole",
    "--loss.max_completion_length 5": "'loss.max_completion_length': cannot be set: it is generation.max_new_tokens",
    "--max-stpes 3": "'max_stpes': unknown setting; did you mean 'max_steps'?",
    "--learning-rate fast": "'optim.learning_rate': 'fast' is not a valid float",
    "--data.on_bad_sample ignore": "'data.on_bad_sample': 'ignore' is not one of error, skip",
    "--dataset ./nothing.jsonl": "'data.dataset': no such file or folder: ./nothing.jsonl",
    "--recipe shapes --dataset /": "'data.dataset': recipe 'shapes' makes its own data",
    "--recipe vsr --prompt-key question": "'data.prompt_key': recipe 'vsr' has fixed column names",
    "--reward-weights 1,heavy": "'data.reward_weights': '1,heavy' is not a valid list",
    "--reward": "'reward': True is not a rewards entry",
}


GRPO_ONLY = ("--num-generations", "--per_device")  # sft and eval refuse them too; train shows it
CASES = [(command, words) for command in ("train", "sft", "eval") for words in BAD
         if command == "train" or not words.startswith(GRPO_ONLY)]


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("a model was loaded")

    monkeypatch.setattr(loader, "load_model", refuse)
    monkeypatch.setattr(policy, "load_model", refuse)


@pytest.mark.parametrize("command, words", CASES, ids=[f"{c} {w}" for c, w in CASES])
def test_bad_setting_is_one_line_naming_it(command, words, capsys, tmp_path):
    message = BAD[words]
    code = main([command, *words.split(), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and err.startswith(f"vlm-grpo {command}: error: setting")
    assert "\n" not in err and "Traceback" not in err


def test_a_bad_value_in_a_yaml_file_is_named_too(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("loss:\n  epsilon: 5\ndata:\n  batch_size: 2\n")
    assert main(["train", "--config", str(path)]) == 2
    assert "setting 'loss.epsilon': 5.0 is out of range" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "setting 'config': no such file" in capsys.readouterr().err


def test_choice_words_yaml_reads_as_booleans_keep_their_meaning(tmp_path):
    # PyYAML reads no/off/on/true as booleans: `mixed_precision: no` must still mean "no", not be refused as False
    path = tmp_path / "run.yaml"
    path.write_text("mixed_precision: no\nperf: {padding_free: on}\ngeneration: {compile_decode: true, cache_implementation: static}\n")
    cfg = load_config(path)
    assert (cfg.mixed_precision, cfg.perf.padding_free, cfg.generation.compile_decode) == ("no", "on", "true")
    off = load_config(base={"perf": {"padding_free": False}, "generation": {"compile_decode": False}})
    assert (off.perf.padding_free, off.generation.compile_decode) == ("off", "false")
    with pytest.raises(ValueError, match="setting 'mixed_precision': True is not one of no, bf16, fp16"):
        load_config(base={"mixed_precision": True})  # no choice is spelt as a YAML true: still refused


def test_trl_names_with_the_same_meaning_are_honoured():
    cfg = load_config(overrides=["--max_completion_length", "256", "--scale_rewards", "false", "--save_steps", "7",
                                 "--save_total_limit", "4", "--lr_scheduler_type", "cosine", "--bf16"])
    assert cfg.generation.max_new_tokens == 256 and cfg.loss.max_completion_length == 256
    assert cfg.scale_rewards == "none" and cfg.logging.save_every == 7 and cfg.logging.keep_checkpoints == 4
    assert cfg.optim.lr_scheduler == "cosine" and cfg.mixed_precision == "bf16"
    yaml_cfg = load_config(base={"scale_rewards": True, "loss": {"epsilon": 0.3}})
    assert yaml_cfg.scale_rewards == "group" and yaml_cfg.loss.epsilon_high == 0.3  # resolved after merging


def test_epsilon_high_follows_epsilon_set_on_the_command_line():
    assert load_config(overrides=["--epsilon", "0.3"]).loss.epsilon_high == 0.3
    assert load_config(overrides=["--epsilon", "0.3", "--epsilon-high", "0.28"]).loss.epsilon_high == 0.28


def test_every_refused_trl_name_is_named_in_one_message(capsys, tmp_path):
    assert main(["train", "--per_device_train_batch_size", "8", "--logging_steps", "5", "--max-steps", "2",
                 "--max_prompt_length", "64", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vlm-grpo train: error: setting 'per_device_train_batch_size, logging_steps, max_prompt_length': "
                          "TRL's names with no same-meaning setting here: per_device_train_batch_size: TRL counts")
    assert "logging_steps: every step is logged" in err and "max_prompt_length: prompts are never cut" in err
    assert "\n" not in err
    cfg = load_config(overrides=["--dataset_name", "org/set", "--dataset_train_split", "dev", "--dataset_test_split", "val"])
    assert (cfg.data.dataset, cfg.data.dataset_split, cfg.eval.split) == ("org/set", "dev", "val")


@pytest.mark.parametrize("command", ["train", "sft"])
def test_mixed_precision_the_device_cannot_run_is_refused(command, capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the question is what a CPU can do
    assert main([command, "--fp16", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"vlm-grpo {command}: error: setting 'mixed_precision': fp16 on a CPU: accelerate runs no fp16 "
                   "autocast there and would train in float32; use bf16 or no")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, warned", [((), True), (("avx512_bf16",), False), (("amx_bf16",), False)])
def test_bf16_on_a_cpu_runs_and_says_what_it_costs_without_native_bf16(flags, warned, caplog, monkeypatch):
    import torch

    from vlm_grpo.grpo.training import precision
    from vlm_grpo.grpo.training.preflight import check_mixed_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: flags)
    with caplog.at_level("WARNING"):
        check_mixed_precision("bf16")  # honoured either way: accepted, and not silently where it is slow
    assert ("mixed_precision bf16 on a CPU without native bfloat16" in caplog.text) is warned
