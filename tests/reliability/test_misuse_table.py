"""A table of bad numbers and misuses, each refused (or handled) with a message naming the setting, file or row and
the value: ranges declared with every numeric setting, reward weights, special files, a step too large for the data
or the memory, disk full while saving, damaged run-log lines, 16-bit images, train() twice."""

from __future__ import annotations

import dataclasses
import logging
import os
import typing

import numpy as np
import pytest
import torch
from PIL import Image

from tests.reliability.test_bad_settings import no_model_loads  # noqa: F401 - autouse: nothing may load a model
from vlm_grpo.cli import main
from vlm_grpo.grpo.setting_fields import SettingError, has_range
from vlm_grpo.grpo.settings.sections import TrainConfig

# flags -> the one line's expected text (after "vlm-grpo train: error: setting ")
BAD_NUMBERS = {
    "--learning-rate 1e308": "'optim.learning_rate': 1e+308 is out of range: it must be <= 10.0 (allowed: [0.0, 10.0])",
    "--learning-rate -1e-5": "'optim.learning_rate': -1e-05 is out of range: it must be >= 0.0",
    "--learning-rate .nan": "'optim.learning_rate': nan is not a finite number (allowed: [0.0, 10.0])",
    "--learning-rate .inf": "'optim.learning_rate': inf is not a finite number",
    "--vision-lr 1e300": "'optim.vision_lr': 1e+300 is out of range",
    "--head-lr -1": "'optim.head_lr': -1.0 is out of range: it must be >= 0.0",
    "--weight-decay 1e9": "'optim.weight_decay': 1000000000.0 is out of range: it must be <= 10.0",
    "--adam-eps 0": "'optim.adam_eps': 0.0 is out of range: it must be > 0.0 (allowed: (0.0, 1.0])",
    "--adam-betas 0.9,1.5": "'optim.adam_betas': 1.5 is out of range: it must be < 1.0 (allowed: [0.0, 1.0))",
    "--max-grad-norm .nan": "'optim.max_grad_norm': nan is not a finite number",
    "--warmup-steps 1e12": "'optim.warmup_steps': 1000000000000 is out of range",
    "--temperature 1e308": "'generation.temperature': 1e+308 is out of range: it must be <= 100.0 (allowed: (0.0, 100.0])",
    "--temperature -1": "'generation.temperature': -1.0 is out of range: it must be > 0.0",
    "--top-p 2": "'generation.top_p': 2.0 is out of range: it must be <= 1.0",
    "--top-k 1e12": "'generation.top_k': 1000000000000 is out of range",
    "--repetition-penalty .inf": "'generation.repetition_penalty': inf is not a finite number",
    "--max-new-tokens 1e9": "'generation.max_new_tokens': 1000000000 is out of range: it must be <= 1048576",
    "--num-generations 1e8": "'data.num_generations': 100000000 is out of range: it must be <= 4096 (allowed: [2, 4096])",
    "--batch-size 1000000000": "'data.batch_size': 1000000000 is out of range: it must be <= 65536 (allowed: [1, 65536])",
    "--batch-size -2": "'data.batch_size': -2 is out of range: it must be >= 1",
    "--data.train_size 1e12": "'data.train_size': 1000000000000 is out of range",
    "--reward-weights 1,nan": "'data.reward_weights': nan is not a finite number (allowed: [-1e+06, 1e+06])",
    "--reward-weights 1e300": "'data.reward_weights': 1e+300 is out of range: it must be <= 1e+06",
    "--reward-weights 2,-inf": "'data.reward_weights': -inf is not a finite number",
    "--reward r.py:f*nan": "'data.rewards': reward 'r.py:f*nan': weight 'nan' is out of range: it must be a finite number",
    "--reward r.py:f*inf": "'data.rewards': reward 'r.py:f*inf': weight 'inf' is out of range",
    "--reward r.py:f*1e300": "'data.rewards': reward 'r.py:f*1e300': weight '1e300' is out of range",
    "--reward-model judge:m*nan": "'data.reward_models': reward 'judge:m*nan': weight 'nan' is out of range",
    "--reward-timeout .inf": "'data.reward_timeout': inf is not a finite number (allowed: [0.0, 86400.0])",
    "--reward-timeout -1": "'data.reward_timeout': -1.0 is out of range: it must be >= 0.0",
    "--tool-timeout 1e308": "'tools.tool_timeout': 1e+308 is out of range: it must be <= 86400.0",
    "--seed 4722366482869645213696": "'seed': 4722366482869645213696 is out of range: it must be <= 4294967295",
    "--seed -1": "'seed': -1 is out of range: it must be >= 0 (allowed: [0, 4294967295])",
    "--data-seed 1e20": "'data.data_seed': 100000000000000000000 is out of range: it must be <= 4294967295",
    "--max-steps 1e12": "'max_steps': 1000000000000 is out of range: it must be <= 1000000000",
    "--max-steps 2.5": "'max_steps': 2.5 is not a valid int",
    "--epochs .nan": "'epochs': nan is not a finite number",
    "--num-iterations 1e6": "'num_iterations': 1000000 is out of range: it must be <= 1000",
    "--gradient-accumulation-steps 0": "'gradient_accumulation_steps': 0 is out of range: it must be >= 1",
    "--beta 1e300": "'loss.beta': 1e+300 is out of range: it must be <= 1000.0",
    "--entropy-coef .nan": "'loss.entropy_coef': nan is not a finite number",
    "--epsilon-high 1e9": "'loss.epsilon_high': 1000000000.0 is out of range: it must be <= 10.0",
    "--lora.r 1e6": "'lora.r': 1000000 is out of range: it must be <= 4096",
    "--lora.dropout 1": "'lora.dropout': 1.0 is out of range: it must be < 1.0",
    "--save-every -1": "'logging.save_every': -1 is out of range: it must be >= 0",
    "--keep-checkpoints 1e12": "'logging.keep_checkpoints': 1000000000000 is out of range",
    "--max-nonfinite-steps -1": "'guard.max_nonfinite_steps': -1 is out of range: it must be >= 0",
    "--kl-spike-factor .inf": "'guard.kl_spike_factor': inf is not a finite number",
    "--eval.size 0": "'eval.size': 0 is out of range: it must be >= 1",
    "--logprob-chunk-mb 1e12": "'perf.logprob_chunk_mb': 1000000000000 is out of range",
    "--vllm-server-timeout .inf": "'rollout.vllm_server_timeout': inf is not a finite number",
}


@pytest.mark.parametrize("flags", list(BAD_NUMBERS))
def test_a_bad_number_is_one_line_naming_setting_value_and_range(flags, capsys, tmp_path):
    code = main(["train", *flags.split(), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("vlm-grpo train: error: setting " + BAD_NUMBERS[flags]), err
    assert "\n" not in err and not (tmp_path / "run").exists()


def _numeric_fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            yield from _numeric_fields(f.default_factory, f"{f.name}.")
        elif "help" in f.metadata and not f.metadata["choices"] and any(
                t in (int, float) for t in _leaf_types(hints[f.name])):
            yield prefix + f.name, f.metadata


def _leaf_types(hint):
    args = typing.get_args(hint)
    return [hint] if not args else [t for a in args for t in _leaf_types(a)]


def test_every_numeric_setting_declares_a_range_with_both_ends():
    fields = dict(_numeric_fields(TrainConfig))
    assert len(fields) > 80  # every section's numbers, the losses' own included
    one_sided = [name for name, meta in fields.items()
                 if not (any(meta.get(k) is not None for k in ("at_least", "above"))
                         and any(meta.get(k) is not None for k in ("at_most", "below")))]
    assert one_sided == [] and all(has_range(meta) for meta in fields.values())


def test_yaml_and_python_values_are_checked_alike(tmp_path):
    with pytest.raises(SettingError, match=r"'optim.learning_rate': 1e\+308 is out of range"):
        TrainConfig(optim={"learning_rate": 1e308})
    with pytest.raises(SettingError, match=r"'seed': 1180591620717411303424 is out of range"):
        TrainConfig(seed=2**70)
    from vlm_grpo.api.trl_configs import GRPOConfig

    with pytest.raises(ValueError, match=r"'generation.temperature': 1e\+308 is out of range"):
        GRPOConfig(output_dir=str(tmp_path), temperature=1e308).to_settings()


# ---------------------------------------------------------------- special files named as what they are
@pytest.fixture
def special(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    return {"fifo": fifo, "folder": folder, "device": "/dev/null"}


@pytest.mark.parametrize("kind, words", [("fifo", "is a named pipe (FIFO), not a file"),
                                         ("folder", "is a directory, not a file"),
                                         ("device", "is a character device, not a file")])
def test_a_special_file_as_config_is_named_as_what_it_is(kind, words, special, capsys, tmp_path):
    assert main(["train", "--config", str(special[kind]), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"vlm-grpo train: error: setting 'config': {special[kind]} {words}"


def test_a_special_file_as_dataset_or_image_is_named(special, capsys, tmp_path):
    assert main(["train", "--dataset", str(special["fifo"]), "--output-dir", str(tmp_path / "run")]) == 2
    assert f"'data.dataset': {special['fifo']} is a named pipe (FIFO), not a data file or folder" in capsys.readouterr().err
    from vlm_grpo.recipes.rows import RowChecker

    checker = RowChecker("my.jsonl", base_dir=tmp_path)
    for kind in ("fifo", "folder"):
        with pytest.raises(ValueError, match=rf"my.jsonl: row 3: field 'image' names {special[kind]}, which is a "
                                             rf"(named pipe|directory)"):
            checker.image(3, {"image": str(special[kind])}, ("image",))


# ---------------------------------------------------------------- a step too large for the data or the memory
def test_a_batch_far_larger_than_the_training_set_is_refused_before_the_model_loads(capsys, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join('{"prompt": "say %d", "answer": "%d"}\n' % (i, i) for i in range(4)))
    assert main(["train", "--dataset", str(rows), "--batch-size", "65536", "--reward",
                 "tests.reliability.step_rewards:lowercase", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "setting 'data.batch_size': 65536 prompts a step from a training set of 4 rows would draw each row about " \
           "16384 times in one step; at most 16 times (data.batch_size <= 64)" in err


def test_a_step_that_cannot_fit_in_memory_is_refused_naming_both_settings():
    from vlm_grpo.adapters.registry import family_class
    from vlm_grpo.grpo.training.step_size import check_against_memory

    model = family_class("qwen2_5_vl").tiny(seed=0).model
    check_against_memory(model, torch.device("cpu"), 2, 4, 25, free=10 * 2**20)  # fits: nothing said
    with pytest.raises(SettingError, match=r"'data.batch_size, data.num_generations': a step holds 4096 prompts x 64 "
                                           r"completions = 262144 sequences of at least 1025 tokens at once: their KV "
                                           r"cache and logits alone need [0-9.]+ GiB, and cpu has 1.0 GiB free"):
        check_against_memory(model, torch.device("cpu"), 4096, 64, 1025, free=2**30)


def test_a_model_whose_layers_differ_is_measured_by_its_largest_layer():
    """Gemma 4's head dims differ per layer and transformers refuses to read one global value: the bound takes the
    largest layer's (a lower bound stays one), and the check runs instead of failing every Gemma 4 run."""
    from vlm_grpo.adapters.generic.shrink import shrink_config
    from vlm_grpo.adapters.generic.twin_model import default_config
    from vlm_grpo.grpo.training.step_size import rollout_bytes

    config = default_config("gemma4")
    shrink_config(config)
    text = config.get_text_config()
    dims = {layer.head_dim for layer in text.per_layer_config}
    assert len(dims) > 1  # a heterogeneous config, as the real one
    kv, _ = rollout_bytes(config, torch.float32, 1, 1)
    assert kv == text.num_hidden_layers * 2 * text.num_key_value_heads * max(dims) * 4


# ---------------------------------------------------------------- disk full while saving
@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4736 vs 4624"),
    RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
    OSError(28, "No space left on device"),
])
def test_disk_full_while_saving_names_the_path_and_space_and_keeps_the_last_checkpoint(error, tmp_path):
    from vlm_grpo.grpo.checkpoint import store as ckpt

    (tmp_path / "checkpoint-1").mkdir()
    tmp = tmp_path / ".tmp-checkpoint-2"
    tmp.mkdir()
    with pytest.raises(OSError, match=rf"disk full while saving {tmp} in {tmp_path}: a checkpoint needs about 12.0 MB, "
                                      r"[0-9.]+ MB are free; the previous checkpoint is kept"):
        with ckpt.resource_errors_say(tmp, tmp_path, need=lambda: 12_000_000):
            raise error
    assert not tmp.exists() and (tmp_path / "checkpoint-1").is_dir()
    with pytest.raises(RuntimeError, match="something else"):  # other failures pass through as they are
        with ckpt.resource_errors_say(tmp_path / "other", tmp_path):
            raise RuntimeError("something else")


# ---------------------------------------------------------------- damaged run-log lines
def _run_with_damaged_logs(run_dir):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1, "reward": 0.5}\n{"step": 2, "loss": 0.2, '
                                           '"reward": 0.6}\n{"step": 3, "lo')
    (run_dir / "completions.jsonl").write_bytes(b'{"step": 1, "completion": "a", "reward": 1.0, "advantage": 0.1}\n'
                                                b'{"step": 2, "compl\xff')


def test_a_damaged_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, caplog, capsys):
    from vlm_grpo.grpo.run.logs import read_jsonl  # what report, plot and completions read run logs with

    run_dir = tmp_path / "run"
    _run_with_damaged_logs(run_dir)
    with caplog.at_level(logging.WARNING):
        assert main(["completions", str(run_dir)]) == 0
        assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    assert f"{run_dir / 'completions.jsonl'}: line 2 is damaged" in caplog.text
    assert f"{run_dir / 'metrics.jsonl'}: line 3 is damaged" in caplog.text


def test_resume_says_which_damaged_line_it_drops(tmp_path, caplog):
    from vlm_grpo.grpo.run.directory import prepare_run_dir
    from vlm_grpo.grpo.run.logs import RunLog

    run_dir = tmp_path / "run"
    _run_with_damaged_logs(run_dir)
    prepare_run_dir(run_dir, resume=True, overwrite=False).release()  # as --resume takes the folder's run files
    with caplog.at_level(logging.WARNING):
        RunLog(run_dir).truncate_after(2)
    assert f"{run_dir / 'metrics.jsonl'}: line 3 is damaged" in caplog.text
    assert f"{run_dir / 'completions.jsonl'}: line 2 is damaged" in caplog.text
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 2


# ---------------------------------------------------------------- images by their declared bit depth
@pytest.mark.parametrize("array, mode, level", [
    (np.full((4, 4), 65535, np.uint16), None, 255),  # uniform white 16-bit stays white (not stretched to black)
    (np.full((4, 4), 0, np.uint16), None, 0),
    (np.full((4, 4), 257 * 100, np.uint16), None, 100),  # 16-bit: divided by 257
    (np.full((4, 4), 1000, np.uint16), None, 4),  # a dark uniform image stays dark
    (np.full((4, 4), 0.5, np.float32), "F", 128),  # float images read as 0..1
    (np.full((4, 4), 257 * 200, np.int32), "I", 200),  # 16-bit values in the 32-bit mode
])
def test_deep_images_are_converted_by_their_declared_depth(array, mode, level):
    from vlm_grpo.images import to_rgb

    img = Image.fromarray(array) if mode is None else Image.fromarray(array, mode=mode)
    assert np.asarray(to_rgb(img))[0, 0].tolist() == [level] * 3
