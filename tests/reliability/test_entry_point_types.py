"""Every public entry point given a wrong value (None, a number, a string, a list, a dict, a path to nothing, a run
folder where a checkpoint or model goes, a file where a folder goes) refuses it in one line naming the argument or
setting, with no traceback, before any model loads and without creating or changing a file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.reliability.test_bad_settings import no_model_loads  # noqa: F401 - autouse: nothing may load a model
from vlm_grpo.api import GRPOConfig, GRPOTrainer, RewardModel, SFTConfig, SFTTrainer, VLMJudge
from vlm_grpo.cli import main


def score(completions, **_):
    return [0.0] * len(completions)


ROWS = [{"prompt": "What is two plus two?"}]
SFT_ROWS = [{"prompt": "What is two plus two?", "completion": "4"}]


def grpo(**given):
    return lambda: GRPOTrainer(**{"model": "tiny:qwen2_5_vl", "reward_funcs": [score], "train_dataset": ROWS, **given})


def sft(**given):
    return lambda: SFTTrainer(**{"model": "tiny:qwen2_5_vl", "train_dataset": SFT_ROWS, **given})


# argument -> the wrong values given it, each (the call, a word its one line must hold: the argument or setting)
API = {
    "GRPOTrainer args": [(grpo(args=3), "args"), (grpo(args="max_steps=2"), "args"),
                         (grpo(args=[("max_steps", 2)]), "args"), (grpo(args=SFTConfig()), "args"),
                         (grpo(args={2: "max_steps"}), "args"), (grpo(args={"max_stpes": 2}), "max_stpes")],
    "GRPOTrainer reward_funcs": [(grpo(reward_funcs=[]), "reward_funcs"), (grpo(reward_funcs=3), "reward_funcs"),
                                 (grpo(reward_funcs=[score, None]), "reward_funcs"),
                                 (grpo(reward_funcs={"score": score}), "reward_funcs")],
    "GRPOTrainer model": [(grpo(model=None), "model"), (grpo(model=3), "model"), (grpo(model=""), "model"),
                          (grpo(model=Path("no/such/model")), "model.name")],
    "GRPOTrainer train_dataset": [(grpo(train_dataset=3), "train_dataset"), (grpo(train_dataset=[]), "train_dataset"),
                                  (grpo(train_dataset={"prompt": "hi"}), "train_dataset"),
                                  (grpo(train_dataset=["hi"]), "train_dataset"),
                                  (grpo(train_dataset=Path("no/such.jsonl")), "data.dataset")],
    "GRPOTrainer eval_dataset": [(grpo(eval_dataset=3), "eval_dataset"), (grpo(eval_dataset={"a": 3}), "eval_dataset")],
    "GRPOTrainer callbacks": [(grpo(callbacks=3), "callbacks"), (grpo(callbacks="mine"), "callbacks")],
    "GRPOTrainer tools": [(grpo(tools=3), "tools"), (grpo(tools=[3]), "tools")],
    "GRPOTrainer environment_factory": [(grpo(environment_factory=3), "environment_factory"),
                                        (grpo(environment_factory={}), "environment_factory")],
    "GRPOTrainer rollout_func": [(grpo(rollout_func="mine"), "rollout_func")],
    "GRPOTrainer optimizers": [(grpo(optimizers=3), "optimizers"), (grpo(optimizers=[None]), "optimizers")],
    "SFTTrainer args": [(sft(args=GRPOConfig()), "args"), (sft(args=3), "args")],
    "SFTTrainer model and train_dataset": [(sft(model=None), "model"), (sft(train_dataset=3), "train_dataset")],
    "SFTTrainer reward_funcs": [(sft(reward_funcs=[]), "reward_funcs")],
    "GRPOConfig config": [(lambda: GRPOConfig(config=3), "config"), (lambda: GRPOConfig(config={"max_steps": 2}), "config"),
                          (lambda: GRPOConfig(config=Path("no/such.yaml")), "config")],
    "GRPOConfig numbers": [(lambda: GRPOConfig(max_steps="x"), "max_steps"),
                           (lambda: GRPOConfig(learning_rate=[1e-5]), "learning_rate")],
    "RewardModel model": [(lambda: RewardModel(None), "RewardModel model"), (lambda: RewardModel(3), "RewardModel model"),
                          (lambda: RewardModel(Path("/no/such/reward-model")), "RewardModel model")],
    "VLMJudge model and question": [(lambda: VLMJudge(None), "VLMJudge model"), (lambda: VLMJudge(3), "VLMJudge model"),
                                    (lambda: VLMJudge("tiny:qwen2_5_vl", question=3), "VLMJudge question")],
}


def files_under(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("argument", list(API))
def test_a_wrong_api_argument_is_one_line_naming_it_and_writes_nothing(argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default output folder would appear here
    for call, named in API[argument]:
        with pytest.raises((TypeError, ValueError)) as raised:
            call()
        message = str(raised.value)
        assert named in message and "\n" not in message, message
        assert files_under(tmp_path) == {}, message


def test_a_mapping_given_as_args_is_taken_as_the_config_keywords():
    from vlm_grpo.api.argument_types import args_argument

    args = args_argument({"max_steps": 3, "lora": {"r": 4}}, GRPOConfig)
    assert isinstance(args, GRPOConfig) and args.max_steps == 3 and args.train_config.lora.r == 4


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """A finished run's folder: two checkpoints and its final model."""
    run = tmp_path / "runs" / "x"
    for step in (2, 4):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    (tmp_path / "afile").write_text("not a folder")
    return run


# command line -> what its one line must hold ({run}: the run folder, {tmp}: the test's folder)
CLI = {
    "train --resume-from {run} --output-dir {tmp}/new": ["'resume_from'", "{run} is a run folder",
                                                          "pass {run}/checkpoint-4 (its newest)", "--resume"],
    "train --resume-from {run}/final --output-dir {tmp}/new": ["'resume_from'", "final model, not a checkpoint",
                                                                "{run}/checkpoint-4", "--init-from {run}/final"],
    "train --resume-from {tmp}/nothing --output-dir {tmp}/new": ["'resume_from'", "does not exist", "checkpoint-N"],
    "train --resume-from {tmp}/afile --output-dir {tmp}/new": ["'resume_from'", "is a file, not a checkpoint"],
    "train --output-dir {tmp}/afile": ["'logging.output_dir'", "afile is a file, not a folder"],
    "train --output-dir {tmp}/afile/run": ["'logging.output_dir'", "afile is a file, not a folder"],
    "sft --output-dir {tmp}/afile": ["'logging.output_dir'", "afile is a file, not a folder"],
    "eval --model {run} --output-dir {tmp}/new": ["'model.name'", "{run} is a run folder, not a model",
                                                  "{run}/final (its final model)", "{run}/checkpoint-4"],
    "train --init-from {run} --output-dir {tmp}/new": ["'model.init_from'", "{run} is a run folder"],
    "eval --output-dir {tmp}/afile": ["'logging.output_dir'", "afile is a file, not a folder"],
    "eval --eval.out {tmp}/runs": ["'eval.out'", "is a directory, not a file"],
}


@pytest.mark.parametrize("line", list(CLI))
def test_a_wrong_path_on_the_command_line_is_one_line_saying_what_to_pass(line, run_folder, capsys):
    tmp = run_folder.parent.parent
    before = files_under(tmp)
    code = main(line.format(run=run_folder, tmp=tmp).split())
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err, err
    for words in CLI[line]:
        assert words.format(run=run_folder, tmp=tmp) in err, err
    assert files_under(tmp) == before


def test_a_stopped_stage_of_an_experiment_says_how_an_experiment_continues(tmp_path):
    from vlm_grpo.experiment.stages import RESUME_HINT
    from vlm_grpo.grpo.interrupts import StopSignal
    from vlm_grpo.grpo.parts.saves import Saves

    ctx = SimpleNamespace(cfg=None, run_dir=tmp_path, resume_hint=RESUME_HINT)
    with pytest.raises(StopSignal) as stop:
        Saves(ctx, checkpoints=None, save_every=0).stopped(15, 3)
    assert str(stop.value.message).endswith("running this vlm-grpo experiment command again continues")
    assert "--resume" not in stop.value.message
