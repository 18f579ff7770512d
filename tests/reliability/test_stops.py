"""Stops and exits: SIGINT/SIGTERM save the step and exit 130/143 (a second signal during the save waits for it, at
any other time stops at once); user code that calls sys.exit or raises KeyboardInterrupt inside a reward is a named
reward error, exit 1, with the last completed step saved. Every resumed run ends with an uninterrupted run's weights.

The signals are sent by the process to itself from inside its reward, so they land mid-step, in-process."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest

from tests.reliability import step_rewards
from tests.reliability.conftest import RUN, same_weights
from vlm_grpo.cli import main
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.checkpoint.manifest import verify


@pytest.fixture(autouse=True)
def no_leftover_actions():
    yield
    step_rewards.ACTIONS.clear()


def _signal(sig):
    return lambda: os.kill(os.getpid(), sig)


def _resume_to(run, steps: int) -> None:
    assert main(["train", *RUN, "--max-steps", str(steps), "--output-dir", str(run), "--resume"]) == 0


def _last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_sigint_saves_the_step_exits_130_and_resume_equals_an_uninterrupted_run(tmp_path, straight, capsys):
    step_rewards.ACTIONS[1] = _signal(signal.SIGINT)  # during step 2
    assert main(["train", *RUN, "--max-steps", "3", "--output-dir", str(tmp_path)]) == 130
    assert _last_line(capsys) == (f"vlm-grpo train: stopped at step 2 by SIGINT; checkpoint-2 saved in {tmp_path}; "
                                  "--resume continues")
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [2] and not (tmp_path / "final").exists()
    _resume_to(tmp_path, 3)
    assert same_weights(tmp_path, straight(3))


def test_a_second_sigterm_during_the_save_waits_for_it(tmp_path, straight, capsys, monkeypatch):
    real_save = ckpt.torch.save

    def save_then_signal(obj, path, *args, **kwargs):  # the second SIGTERM lands while checkpoint-1 is written
        if ".tmp-checkpoint-1" in str(path) and str(path).endswith("optimizer.pt"):
            os.kill(os.getpid(), signal.SIGTERM)
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", save_then_signal)
    step_rewards.ACTIONS[0] = _signal(signal.SIGTERM)
    assert main(["train", *RUN, "--max-steps", "3", "--output-dir", str(tmp_path)]) == 143
    err = capsys.readouterr().err
    assert "SIGTERM: a checkpoint is being written; stopping as soon as it is complete" in err
    assert err.strip().splitlines()[-1] == (f"vlm-grpo train: stopped at step 1 by SIGTERM; checkpoint-1 saved in "
                                            f"{tmp_path}; --resume continues")
    assert verify(tmp_path / "checkpoint-1") == [] and not list(tmp_path.glob(".tmp-*"))
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    _resume_to(tmp_path, 3)
    assert same_weights(tmp_path, straight(3))


def test_a_second_signal_outside_a_save_stops_at_once(tmp_path, straight, capsys):
    step_rewards.ACTIONS[1] = lambda: (os.kill(os.getpid(), signal.SIGINT), os.kill(os.getpid(), signal.SIGINT))
    assert main(["train", *RUN, "--max-steps", "3", "--save-every", "1", "--output-dir", str(tmp_path)]) == 130
    assert _last_line(capsys) == ("vlm-grpo train: stopped at once by a second SIGINT during step 2; not saved: the "
                                  "newest checkpoint is checkpoint-1; --resume continues from it")
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [1]
    _resume_to(tmp_path, 3)
    assert same_weights(tmp_path, straight(3))


@pytest.mark.parametrize("leave, says", [
    (lambda: sys.exit(0), "called sys.exit(0)"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "raised KeyboardInterrupt"),
], ids=["exit-0", "keyboard-interrupt"])
def test_a_reward_that_exits_is_a_named_error_and_the_last_completed_step_is_saved(leave, says, tmp_path, straight,
                                                                                    capsys):
    # during step 3, on the batch; then again in the re-run that finds the completion to name
    step_rewards.ACTIONS[2] = lambda: (step_rewards.ACTIONS.__setitem__(2, leave), leave())
    assert main(["train", *RUN, "--max-steps", "4", "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == ("checkpoint-2 saved (the last completed step, before the failure); --resume continues from it "
                       "once the cause is fixed")
    assert re.match(rf"vlm-grpo train: error: reward 'lowercase' \(.*step_rewards.py:\d+\) {re.escape(says)} on completion 0 \(",
                    err[-1])
    assert err[-1].endswith(", step 3: a reward must return its scores, not end the program")
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [2]
    _resume_to(tmp_path, 3)
    assert same_weights(tmp_path, straight(3))
