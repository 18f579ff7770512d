"""Dynamic sampling (data.dynamic_sampling): groups without reward spread are dropped and the batch refilled from
the next prompts in the run's order; the retry limit fills the rest with groups without spread; the order is the
seed's, and a resume continues it."""

from __future__ import annotations

import shutil

import pytest
import torch

from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.loop.grpo_stage import GRPOStage
from vlm_grpo.grpo.parts.dynamic_sampling import group_spread
from vlm_grpo.grpo.run.logs import read_jsonl
from tests.grpo.test_trainer import run_config, weights
from tests.trained import trained

EVEN = ["--model", "tiny:qwen2_5_vl", "--reward", "tests/grpo/toy_rewards.py:lowercase_share_on_even_counts",
        "--data.dynamic_sampling", "true"]


def test_group_spread_reads_each_group_and_ignores_rewards_that_do_not_apply():
    nan = float("nan")
    total = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, nan, nan, nan, 3.0, 3.0, nan, 4.0, 0.5, 0.5, 0.5])
    assert group_spread(total, 3).tolist() == [False, True, False, True, False]


def _generations(monkeypatch) -> list:
    seen, original = [], GRPOStage._rollout_batch

    def watched(self, index, resumed_inside=False):
        gen = original(self, index, resumed_inside)
        gen.drawn_from = self.draws.generation_start  # the first rollout batch its draws took
        seen.append(gen)
        return gen

    monkeypatch.setattr(GRPOStage, "_rollout_batch", watched)
    return seen


def test_only_groups_with_spread_train_and_the_draws_are_counted(tmp_path, monkeypatch):
    seen = _generations(monkeypatch)
    rows = trained(GRPOTrainer.from_settings(run_config(tmp_path / "a", *EVEN, "--max-steps", "3")))
    g = 4
    for gen, row in zip(seen, rows):
        traj = gen.scored.trajectory
        assert group_spread(traj.rewards, g).all()
        assert all(int(s.fields["answer"]) % 2 == 0 for s in gen.batch.samples)  # the others have a constant reward
        assert len(gen.batch.samples) == 2 and row["dynamic_sampling/filled_without_spread"] == 0.0
        assert traj.completion_ids.shape[0] == 2 * g and traj.prompts.input_ids.shape[0] == 2
    assert max(r["dynamic_sampling/draws"] for r in rows) > 1  # some steps refilled
    again = trained(GRPOTrainer.from_settings(run_config(tmp_path / "b", *EVEN, "--max-steps", "3")))
    drop = ("step_time",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in again] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rows]  # the seed's order, drawn the same way


def test_the_retry_limit_fills_the_batch_with_groups_without_spread(tmp_path, monkeypatch):
    seen = _generations(monkeypatch)
    rows = trained(GRPOTrainer.from_settings(run_config(
        tmp_path, "--model", "tiny:qwen2_5_vl", "--reward", "tests/grpo/toy_rewards.py:constant",
        "--data.dynamic_sampling", "true", "--data.dynamic_sampling_max_draws", "2", "--max-steps", "2")))
    assert [r["dynamic_sampling/draws"] for r in rows] == [3.0, 3.0]  # the first and 2 more
    assert [r["dynamic_sampling/filled_without_spread"] for r in rows] == [2.0, 2.0]
    assert [r["dynamic_sampling/spread_share"] for r in rows] == [0.0, 0.0]
    # each step takes the first batch it drew (nothing had spread); the next step starts after all three
    assert [gen.batch.rows for gen in seen] == [order_rows(0), order_rows(3)]


def order_rows(index: int) -> list[int]:
    """The rows the run's order (seed 0, 256 rows, 2 a batch) gives rollout batch `index`."""
    from vlm_grpo.grpo.data.order import batch_indices

    return batch_indices(256, 2, index, 0)


def _comparable(rows):
    return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]


@pytest.mark.parametrize("extra", [[], ["--steps-per-generation", "2"]], ids=["one_step", "two_steps_a_generation"])
def test_resume_continues_the_order_and_gives_the_same_weights(tmp_path, monkeypatch, extra):
    seen = _generations(monkeypatch)
    common = [*EVEN, "--max-steps", "4", "--learning-rate", "3e-3", *extra]
    straight, split = tmp_path / "straight", tmp_path / "split"
    trained(GRPOTrainer.from_settings(run_config(straight, *common)))
    straight_starts = [gen.drawn_from for gen in seen]
    save = "3" if extra else "2"  # with two steps a generation: saved inside one, resumed inside it
    trained(GRPOTrainer.from_settings(run_config(split, *common, "--save-every", save)))
    shutil.rmtree(split / "final")
    if (split / "checkpoint-4").exists():
        shutil.rmtree(split / "checkpoint-4")
    lines = (split / "metrics.jsonl").read_text().splitlines()
    (split / "metrics.jsonl").write_text("\n".join(lines[:int(save)]) + "\n")
    seen.clear()
    trained(GRPOTrainer.from_settings(run_config(split, *common, "--save-every", save, "--resume")))
    a, b = weights(straight / "final"), weights(split / "final")
    # inside a generation the resumed run replays the draws the checkpoint kept (not a new rollout): the same weights
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _comparable(read_jsonl(straight / "metrics.jsonl")) == _comparable(read_jsonl(split / "metrics.jsonl"))
    if extra:  # the generation replayed starts where the saved one started
        assert [gen.drawn_from for gen in seen] == straight_starts[1:] and straight_starts[1] > 1
        assert seen[0].restored and (split / "checkpoint-3" / "generation.json").is_file()
