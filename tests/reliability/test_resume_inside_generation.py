"""With steps_per_generation k > 1 a checkpoint may fall inside a generation: the run resumed from it trains the
generation's remaining steps on the draws the checkpoint kept, with the old log-probs of the weights that sampled
them, so its weights and logged numbers equal an uninterrupted run's. A saved generation that was tampered with is
refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.conftest import RUN
from vlm_grpo.api import GRPOTrainer
from vlm_grpo.grpo.checkpoint.run_state import BadRunState
from vlm_grpo.grpo.settings.sources import load_config

TIMING = ("step_time", "perf/", "timing/")


def _train(out, *extra):
    trainer = GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--output-dir", str(out), *extra]))
    trainer.train()
    return trainer


def _metrics(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _stopped_after(run, step: int) -> None:
    """As a run killed after checkpoint-`step` leaves it."""
    shutil.rmtree(run / "final")
    for path in run.glob("checkpoint-*"):
        if int(path.name.split("-")[1]) > step:
            shutil.rmtree(path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:step]) + "\n")


@pytest.mark.parametrize("k, steps, saved_at, extra", [
    (2, 4, 1, []),  # saved after the first of two steps
    (3, 3, 2, ["--num-iterations", "2", "--beta", "0.04", "--num-generations", "3"]),  # after the 2nd of 3: old, ref log-probs
], ids=["2-steps-saved-after-1", "3-steps-saved-after-2"])
def test_a_run_resumed_inside_a_generation_equals_the_uninterrupted_run(tmp_path, k, steps, saved_at, extra):
    generations = [] if "--num-generations" in extra else ["--num-generations", "2"]
    common = ["--max-steps", str(steps), "--steps-per-generation", str(k), "--batch-size", "2", *generations, *extra]
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(straight, *common)
    _train(split, *common, "--save-every", str(saved_at), "--logging.keep_checkpoints", "0")
    assert (split / f"checkpoint-{saved_at}" / "generation.json").is_file()  # saved inside a generation
    _stopped_after(split, saved_at)
    _train(split, *common, "--save-every", str(saved_at), "--resume")
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(split / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    assert _metrics(straight) == _metrics(split)
    logged = [json.loads(line) for line in (split / "completions.jsonl").read_text().splitlines()] \
        if (split / "completions.jsonl").is_file() else []
    assert len({row["step"] for row in logged}) <= -(-steps // k)  # a generation's completions logged once


def test_a_checkpoint_at_a_generations_end_keeps_no_generation(tmp_path):
    _train(tmp_path / "run", "--max-steps", "2", "--steps-per-generation", "2", "--batch-size", "2",
           "--num-generations", "2", "--save-every", "2", "--logging.checkpoint_at_end", "false")
    assert not (tmp_path / "run" / "checkpoint-2" / "generation.json").exists()


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(order=[0, 0, 1, 2]), "is not an order of the generation's rows"),
    (lambda d: d.update(report="many"), "is not a saved generation"),
    (lambda d: d["batches"][0].pop("rows"), "is not a saved rollout batch"),
])
def test_a_tampered_saved_generation_is_refused_naming_the_file(tmp_path, change, problem):
    from vlm_grpo.grpo.parts.generation_state import GenerationInProgress

    run = tmp_path / "run"
    _train(run, "--max-steps", "2", "--steps-per-generation", "2", "--batch-size", "2", "--num-generations", "2",
           "--save-every", "1")
    checkpoint = run / "checkpoint-1"
    data = json.loads((checkpoint / "generation.json").read_text())
    change(data)
    (checkpoint / "generation.json").write_text(json.dumps(data))
    with pytest.raises(BadRunState, match=rf"generation.json.*{problem}"):
        GenerationInProgress(None, None).load_state_dict({}, checkpoint)
