"""What `--resume` may change: settings that change what the run means are refused naming each difference unless
accepted (then honoured and recorded), safe ones are honoured, and a run that crashed before its first checkpoint
starts over instead of appending to what it logged."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.reliability.conftest import RUN, same_weights
from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.training import policy
from vlm_grpo.markdown_text import escaped

VOLATILE = ("step_time",)  # wall-clock values differ between any two runs


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A finished 2-step run with a checkpoint after each step."""
    run = tmp_path_factory.mktemp("two") / "run"
    assert main(["train", *RUN, "--max-steps", "2", "--save-every", "1", "--output-dir", str(run)]) == 0
    return run


def _copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def _files(run):
    """Every file's bytes but the lock's and the created-files list's: a --resume takes a copied run's files as its
    own at the start, so the list then records the copies (`_listed` checks it names the same files)."""
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
            if p.is_file() and p.name not in (".run.lock", ".vlm-grpo-files.json")}


def _listed(run):
    return sorted(json.loads((run / ".vlm-grpo-files.json").read_text())["files"])


def _error(capsys) -> str:
    """stderr less the notes of a flag that replaced RUN's value (the test's own override)."""
    lines = capsys.readouterr().err.strip().splitlines()
    return "\n".join(line for line in lines if "given earlier on the command line" not in line)


def test_meaning_changes_are_refused_naming_each_difference(two_steps, tmp_path, capsys):
    run = _copy(two_steps, tmp_path)
    before, listed = _files(run), _listed(run)
    code = main(["train", *RUN, "--max-steps", "3", "--output-dir", str(run), "--resume", "--learning-rate", "5e-3",
                 "--num-generations", "2", "--seed", "1", "--temperature", "0.7"])
    assert code == 2
    err = _error(capsys)
    assert err == (f"vlm-grpo train: error: setting 'resume': these settings differ from {run}/checkpoint-2's and "
                   "change what the run means: data.num_generations 4 -> 2; generation.temperature 1.0 -> 0.7; "
                   "optim.learning_rate 0.001 -> 0.005; seed 0 -> 1. Resume with the checkpoint's values, accept the "
                   "changes with --resume-accept data.num_generations,generation.temperature,optim.learning_rate,seed "
                   "(recorded in config.yaml's history and the model card), or start a new run")
    assert _files(run) == before and _listed(run) == listed  # config.yaml still says what the run used


@pytest.mark.parametrize("words, difference", [
    (["--model", "tiny:smolvlm"], "model.name 'tiny:qwen2_5_vl' -> 'tiny:smolvlm'"),
    (["--lora.r", "4"], "lora.r 0 -> 4"),
    (["--freeze", "vision"], "optim.freeze [] -> ['vision']"),
])
def test_changes_the_checkpoint_is_shaped_by_cannot_resume_even_when_accepted(two_steps, words, difference, capsys,
                                                                                monkeypatch):
    monkeypatch.setattr(policy, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(["train", *RUN, "--max-steps", "3", "--output-dir", str(two_steps), "--resume", *words,
                 "--resume-accept", "all"])
    assert code == 2
    err = _error(capsys)
    assert err == (f"vlm-grpo train: error: setting 'resume': {two_steps}/checkpoint-2 cannot continue with {difference}: "
                   "the checkpoint's weights and optimizer state are shaped by these, so this is a new run (another "
                   "--output-dir, or --overwrite-output-dir)")


def test_a_max_steps_below_the_checkpoint_is_refused(two_steps, capsys):
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(two_steps), "--resume"]) == 2
    assert _error(capsys) == (
        f"vlm-grpo train: error: setting 'max_steps': 1 is below {two_steps}/checkpoint-2's step 2: a resumed run "
        "continues to a max_steps of at least 2")
    assert "Trained with vlm-grpo (GRPO), 2 steps" in (two_steps / "final" / "README.md").read_text()


def test_safe_changes_are_honoured_and_the_run_equals_an_uninterrupted_one(two_steps, straight, tmp_path):
    run = _copy(two_steps, tmp_path)
    assert main(["train", *RUN, "--max-steps", "3", "--output-dir", str(run), "--resume", "--keep-checkpoints", "0",
                 "--log-completions", "false"]) == 0
    assert same_weights(run, straight(3))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["max_steps"] == 3 and saved["logging"]["keep_checkpoints"] == 0
    assert saved["history"] == [{"resumed_at_step": 2, "from": f"{run}/checkpoint-2", "changed": {
        "logging.output_dir": {"was": str(two_steps), "now": str(run)},  # the copy this test resumes
        "logging.save_every": {"was": 1, "now": 100}, "logging.keep_checkpoints": {"was": 2, "now": 0},
        "logging.log_completions": {"was": True, "now": False}, "max_steps": {"was": 2, "now": 3}}}]
    assert load_config(run / "config.yaml").max_steps == 3  # the history is not a setting: the file stays a --config
    assert "Trained with vlm-grpo (GRPO), 3 steps" in (run / "final" / "README.md").read_text()
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def _reference_with_rate_change(tmp_path, words, at_step: int, lr: float):
    """An in-memory run that trains `at_step` steps, then switches every group's learning rate to `lr`."""
    trainer = GRPOTrainer.from_settings(load_config(overrides=[*words, "--output-dir", str(tmp_path / "reference")]))
    for step in range(trainer.cfg.max_steps):
        if step == at_step:
            for group in trainer.optimizer.param_groups:
                group["lr"] = lr
        trainer.train_step(step)
    trainer.checkpoints.save_final()
    return tmp_path / "reference"


def test_an_accepted_learning_rate_change_trains_at_the_new_rate_and_is_recorded(two_steps, straight, tmp_path):
    run = _copy(two_steps, tmp_path)
    assert main(["train", *RUN, "--max-steps", "3", "--output-dir", str(run), "--resume", "--learning-rate", "5e-3",
                 "--resume-accept", "optim.learning_rate"]) == 0
    rates = [{k: v for k, v in r.items() if k.startswith("lr/")} for r in read_jsonl(run / "metrics.jsonl")]
    assert [set(r.values()) for r in rates] == [{1e-3}, {1e-3}, {5e-3}]
    assert same_weights(run, _reference_with_rate_change(tmp_path, [*RUN, "--max-steps", "3"], at_step=2, lr=5e-3))
    assert not same_weights(run, straight(3))  # not silently trained at the checkpoint's rate
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["optim"]["learning_rate"] == 5e-3
    assert saved["history"][0]["accepted"] == {"optim.learning_rate": {"was": 0.001, "now": 0.005}}
    card = (run / "final" / "README.md").read_text()
    assert "learning rate 0.005" in card
    assert "- " + escaped(f"resumed at step 2 from {run}/checkpoint-2; accepted changes: optim.learning_rate 0.001 -> "
                          f"0.005; other changes: logging.output_dir '{two_steps}' -> '{run}', logging.save_every 1 -> "
                          "100, max_steps 2 -> 3") in card  # as markdown that renders as the text


def test_a_crash_before_the_first_checkpoint_then_resume_starts_over(straight, tmp_path, capsys):
    """What such a crash leaves: the settings and the steps logged so far, no checkpoint."""
    done = straight(2)
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "completions.jsonl"):
        shutil.copyfile(done / name, run / name)
    assert main(["train", *RUN, "--max-steps", "2", "--output-dir", str(run), "--resume"]) == 0
    assert f"--resume: no complete checkpoint in {run}; starting from step 0 (dropped 2 logged steps that no " \
           "checkpoint holds)" in capsys.readouterr().out
    rows, expected = read_jsonl(run / "metrics.jsonl"), read_jsonl(done / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows] == \
           [{k: v for k, v in r.items() if k not in VOLATILE} for r in expected]
    assert read_jsonl(run / "completions.jsonl") == read_jsonl(done / "completions.jsonl")
    assert same_weights(run, done)


def test_an_accepted_name_that_is_no_setting_is_refused(two_steps, capsys):
    assert main(["train", *RUN, "--max-steps", "3", "--output-dir", str(two_steps), "--resume",
                 "--resume-accept", "lerning_rate"]) == 2
    assert _error(capsys) == ("vlm-grpo train: error: setting 'resume_accept': 'lerning_rate': unknown "
                                               "setting; did you mean 'learning_rate'?")


def test_each_settings_resume_policy_is_the_one_declared_with_it():
    """The policy travels with the declaration: a field's own `resume=`, else its section's RESUME, else refused."""
    import dataclasses

    from vlm_grpo.grpo.checkpoint.resume_rules import compare
    from vlm_grpo.grpo.setting_fields import RESUME_POLICIES, resume_policies, setting

    policies = resume_policies(load_config(overrides=[]))
    assert set(policies.values()) <= set(RESUME_POLICIES)
    assert (policies["logging.save_every"], policies["lora.r"], policies["optim.learning_rate"],
            policies["loss.max_completion_length"], policies["max_steps"]) == ("honoured", "fixed", "refused",
                                                                               "ignored", "honoured")

    @dataclasses.dataclass
    class Section:
        RESUME = "honoured"
        cadence: int = setting(1, help="a section default applies")
        shape: int = setting(1, resume="fixed", help="a field's own wins")

    @dataclasses.dataclass
    class Scratch:
        section: Section = dataclasses.field(default_factory=Section)
        meaning: int = setting(1, help="undeclared: refused")

    declared = resume_policies(Scratch())
    assert declared == {"section.cadence": "honoured", "section.shape": "fixed", "meaning": "refused"}
    kinds = {c.key: c.kind for c in compare({"section": {"cadence": 1, "shape": 1}, "meaning": 1},
                                            {"section": {"cadence": 2, "shape": 2}, "meaning": 2}, [], declared)}
    assert kinds == {"section.cadence": "safe", "section.shape": "fixed", "meaning": "refused"}
    with pytest.raises(ValueError, match="resume='later'"):
        setting(1, resume="later", help="not a policy")


def test_where_vllm_runs_may_move_on_resume_and_the_engine_may_not():
    """A resumed vLLM run may reach its server elsewhere, over another transport, or sync LoRA another way (the same
    policy samples either way); switching the engine itself changes how completions are drawn and is refused."""
    from vlm_grpo.grpo.checkpoint.resume_rules import compare
    from vlm_grpo.grpo.setting_fields import resume_policies
    from vlm_grpo.grpo.settings.sections import TrainConfig

    saved = TrainConfig(rollout={"engine": "vllm", "vllm_mode": "server", "vllm_server_port": 8000})
    moved = TrainConfig(rollout={"engine": "vllm", "vllm_mode": "colocate", "vllm_server_port": 9000,
                                 "vllm_group_port": 51300, "vllm_weight_transport": "distributed",
                                 "vllm_server_host": "10.0.0.2", "vllm_server_timeout": 60.0, "vllm_lora_sync": "merged"})
    as_dict = lambda cfg: json.loads(json.dumps(cfg.to_dict()))  # noqa: E731
    changes = compare(as_dict(saved), as_dict(moved), [], resume_policies(moved))
    assert {c.key for c in changes} == {"rollout.vllm_mode", "rollout.vllm_server_port", "rollout.vllm_group_port",
                                        "rollout.vllm_weight_transport", "rollout.vllm_server_host",
                                        "rollout.vllm_server_timeout", "rollout.vllm_lora_sync"}
    assert {c.kind for c in changes} == {"safe"}
    engine = compare(as_dict(saved), as_dict(TrainConfig()), [], resume_policies(saved))
    assert [(c.key, c.kind) for c in engine if c.key == "rollout.engine"] == [("rollout.engine", "refused")]
