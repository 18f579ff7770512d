"""The hacking and grounding monitors in real runs: a format-only reward and collapsed groups trip theirs, image
reliance separates a model that looks from one that cannot, and the guards never change what a run trains."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from vlm_grpo.grpo.settings.sources import load_recipe_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.guards.protocol import TrainingHalted
from vlm_grpo.inspect.completions import format_rows, load_completions, select
from vlm_grpo.inspect.plots import RunData, charts
from vlm_grpo.loader import load_model
from tests.trained import trained

SHAPES = ["--data.recipe_options", "{image_size: 64}", "--batch-size", "4", "--num-generations", "8", "--beta", "0",
          "--eval.before_after", "false", "--logging.plot", "false", "--logging.progress", "false", "--save-every", "0"]
WINDOW = 6
# the shipped checkpoint learns to name the shape within a few steps; correctness is watched, never paid (weight 0)
FORMAT_ONLY = ["--reward", "description=vlm_grpo.recipes.shapes:description",
               "--reward", "correctness=vlm_grpo.recipes.shapes:correctness*0", "--learning-rate", "1e-3",
               "--monitor-window", str(WINDOW), "--reliance-every", "2"]


def load_config(overrides):
    """The settings `vlm-grpo train` would use: the shipped checkpoint's GRPO defaults under these (frozen encoder)."""
    return load_recipe_config(None, overrides)[0]


def rows(run_dir, name="metrics.jsonl"):
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def format_only_run(tmp_path_factory):
    """The default run's model rewarded for naming the shape only: the rising-component monitor's case."""
    run = tmp_path_factory.mktemp("format-only")
    cfg = load_config(overrides=[*SHAPES, *FORMAT_ONLY, "--max-steps", str(WINDOW), "--output-dir", str(run),
                                 "--logging.overwrite_output_dir", "true"])
    with pytest.MonkeyPatch.context() as mp:
        warnings = []
        mp.setattr("vlm_grpo.grpo.guards.hacking_watch.log.warning", lambda msg, *a: warnings.append(msg % a))
        trainer = GRPOTrainer.from_settings(cfg)
        trained(trainer)
    return run, warnings


def test_a_format_only_reward_trips_the_rising_component_monitor_within_the_window(format_only_run):
    run, warnings = format_only_run
    history = rows(run)
    tripped = [m["step"] for m in history if m["guards/trips/rising_component"] > 0]
    assert tripped and tripped[0] <= WINDOW
    assert history[-1]["rewards/description"] > history[0]["rewards/description"] + 0.2
    said = [w for w in warnings if w.startswith("guard rising_component")]
    assert len(said) == 1 and f"step {tripped[0]}: reward 'description' rose" in said[0] and "Examples: '" in said[0]
    audit = json.loads((run / "reward-audit.json").read_text())  # custom rewards: the recipe's acceptance is void
    assert any("reward 'description' pays format_only" in line for line in audit["flags"])
    assert any(w.startswith("reward audit: reward 'description' pays format_only") for w in warnings)


def test_flagged_completions_are_marked_in_the_log_and_the_view(format_only_run):
    run, _ = format_only_run
    completions = load_completions(run)
    flagged = select(completions, flagged=True)
    assert flagged and all(r["flags"] == ["rising_component"] for r in flagged)
    assert all(r["rewards"]["description"] > 0 and r["rewards"]["correctness"] == 0 for r in flagged)
    assert "FLAGGED: rising_component" in format_rows(flagged[:1], width=100)


def test_plots_and_card_show_image_reliance_and_the_guards_counts(format_only_run):
    run, _ = format_only_run
    history = rows(run)
    measured = [m["step"] for m in history if "grounding/image_reliance" in m]
    assert measured == [1, 3, 5]  # every 2 steps from the first
    assert all(m["grounding/image_reliance"] > 0.1 and 0 < m["grounding/attention_to_image"] < 1
               for m in history if "grounding/image_reliance" in m)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = {c.name: c for c in charts(RunData.load(run))}  # what `vlm-grpo plot` draws; the new charts drawn here
    new = ("image_reliance", "attention_to_image", "hacking_signs", "guard_trips")
    fig, axes = plt.subplots(1, len(new))
    for ax, name in zip(axes, new):
        made[name].draw(ax)
    assert [len(ax.lines) for ax in axes] == [4, 2, 6, 2 * 5]  # points and trend per series
    plt.close(fig)
    card = (run / "final" / "README.md").read_text()
    assert "## Grounding and reward-hacking guards" in card and "| image reliance vs a blank image (nats/token) |" in card
    trips = history[-1]["guards/trips/rising_component"]
    assert f"rising_component {trips}," in card
    flagged = json.loads((run / "reward-audit.json").read_text())["flags"]  # format_only, echo (content-free), ...
    assert len(flagged) >= 2 and f"Reward audit at the start (8 samples): {len(flagged)} exploits flagged" in card


def test_identical_groups_trip_their_monitor_and_can_stop_the_run_after_a_checkpoint(tmp_path, caplog):
    greedy = [*SHAPES, "--top-k", "1", "--max-steps", "4", "--reliance-every", "0", "--audit-at-start", "false"]
    with caplog.at_level(logging.WARNING):
        history = trained(GRPOTrainer.from_settings(load_config(overrides=[*greedy, "--output-dir", str(tmp_path / "warn")])))
    assert [m["guards/identical_groups"] for m in history] == [1.0] * 4
    assert [m["guards/trips/identical_groups"] for m in history] == [0, 1, 2, 3]  # 2 steps in a row, then each step
    assert "guard identical_groups: step 2: in 100% of the groups all completions were identical" in caplog.text
    stop = tmp_path / "stop"
    with pytest.raises(TrainingHalted, match=r"step 2: .*identical.*checkpoint-2 saved, stopped"):
        trained(GRPOTrainer.from_settings(load_config(overrides=[*greedy, "--output-dir", str(stop), "--on-hacking", "stop"])))
    assert [p.name for p in stop.glob("checkpoint-*")] == ["checkpoint-2"] and not (stop / "final").exists()


def test_image_reliance_is_zero_when_the_vision_output_is_cut_off(tmp_path):
    adapter = load_model("tiny:hybrid_llava", seed=0)
    params = dict(adapter.model.named_parameters())
    with torch.no_grad():  # a projector of zeros: every image gives the language model the same (zero) features
        for name in adapter.module_groups()["projector"]:
            params[name].zero_()
    cfg = load_config(overrides=[*SHAPES, "--model", "tiny:hybrid_llava", "--max-steps", "1", "--max-new-tokens", "8",
                                 "--freeze", "vision,projector", "--reliance-every", "1", "--audit-at-start", "false",
                                 "--output-dir", str(tmp_path)])
    metrics = trained(GRPOTrainer.from_settings(cfg, adapter=adapter))[0]
    assert metrics["grounding/image_reliance"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["grounding/image_reliance_swap"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["guards/trips/image_reliance"] == 1  # "the model does not use the image" from the first measurement


def test_the_guards_do_not_change_what_a_run_trains_and_the_default_model_relies_on_the_image(tmp_path):
    base = [*SHAPES, "--max-steps", "2", "--max-new-tokens", "12"]
    on = GRPOTrainer.from_settings(load_config(overrides=[*base, "--reliance-every", "1", "--output-dir", str(tmp_path / "on")]))
    on_history = trained(on)
    off = GRPOTrainer.from_settings(load_config(overrides=[*base, "--reliance-every", "0", "--audit-at-start", "false",
                                             "--output-dir", str(tmp_path / "off")]))
    off_history = trained(off)
    for a, b in zip(on_history, off_history):
        assert {k: v for k, v in a.items() if k in b and k != "step_time"} == {k: v for k, v in b.items() if k != "step_time"}
    assert all(torch.equal(p, q) for p, q in zip(on.adapter.model.parameters(), off.adapter.model.parameters()))
    assert "grounding/image_reliance" in on_history[1] and "grounding/image_reliance" not in off_history[1]
    # the default run's model and settings: its sampled answers need their image (a blank one makes them unlikely)
    assert min(m["grounding/image_reliance"] for m in on_history) > 0.3
