"""Asynchronous rollouts (rollout.max_staleness K): a worker process samples K steps ahead of the trainer. Checked
against the synchronous loop (a policy that does not move samples the same completions either way), for the bound
on staleness, for resume (the queue travels in the checkpoint), for a worker that dies, and the loss's correction
against a hand computation."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.algorithm.losses import LossConfig, LossInputs, PolicyObjective
from vlm_grpo.grpo.algorithm.sampling_correction import sampling_correction
from vlm_grpo.grpo.parts.rollout_source import AsyncDraws
from vlm_grpo.grpo.rollout.asynchronous.worker_handle import WorkerFailed
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.setting_fields import SettingError
from tests.grpo.test_trainer import run_config, weights
from tests.trained import trained

MODEL = ["--model", "tiny:qwen2_5_vl"]
NEW_KEYS = ("async/", "sampling/")  # what only an asynchronous run logs
COST_KEYS = ("step_time", "perf/vision_calls", "perf/vision_images")  # its trainer encodes the images itself


# the loss and what it reads: weighed by a ratio of decode-time to teacher-forced probabilities, 1 to float precision
WEIGHED = ("loss", "grad_norm", "clip_ratio/", "entropy", "kl")


def _same_keys(row: dict, weighed: bool) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NEW_KEYS) and k not in COST_KEYS
            and k.startswith(WEIGHED) == weighed}


# the default run's checkpoint (a llava-type model: its projector reads a hidden state transformers records by hooks)
DEFAULT = ["--model", "pretrained:shapes-tiny", "--batch-size", "2", "--num-generations", "4", "--eval.before_after",
           "false", "--data.recipe_options", "{image_size: 64}"]


def test_a_policy_that_does_not_move_samples_the_same_completions_two_steps_ahead(tmp_path):
    k = 2
    common = [*DEFAULT, "--max-steps", str(k + 1), "--learning-rate", "0"]
    sync = trained(GRPOTrainer.from_settings(run_config(tmp_path / "sync", *common)))
    ahead = trained(GRPOTrainer.from_settings(run_config(tmp_path / "ahead", *common, "--rollout.max_staleness", str(k))))
    assert [_same_keys(r, False) for r in ahead] == [_same_keys(r, False) for r in sync]  # rewards, lengths, ...
    for a, s in zip(ahead, sync):
        weighed = _same_keys(s, True)
        assert weighed and _same_keys(a, True) == pytest.approx(weighed, rel=1e-4, abs=1e-6)
    assert (tmp_path / "ahead" / "completions.jsonl").read_text() == (tmp_path / "sync" / "completions.jsonl").read_text()
    assert [r["async/staleness"] for r in ahead] == [float(s) for s in range(k + 1)]
    for r in ahead:  # the same weights sampled: the worker's log-probs are the trainer's
        assert r["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
        assert r["sampling/sampling_logp_difference/max"] < 1e-4


@pytest.mark.parametrize("model, temperature", [("tiny:qwen2_5_vl", 0.7), ("tiny:idefics3", 1.3)])
def test_log_probs_taken_as_tokens_are_drawn_are_the_teacher_forced_ones(tmp_path, model, temperature):
    """What the worker sends as its sampling log-probs (adapters.sampler.TokenLogps, during generate()) against a
    full forward over the sampled completions, on two families and vocabularies, top-k on (it must not change them)."""
    from vlm_grpo.adapters.sampler import TokenLogps
    from vlm_grpo.grpo.logprobs.completions import group_scores
    from vlm_grpo.grpo.rollout.generation import encode, rollout
    from vlm_grpo.grpo.training.policy import sampling_with

    cfg = run_config(tmp_path, "--model", model, "--max-steps", "1", "--temperature", str(temperature),
                     "--generation.top_k", "20", "--max-new-tokens", "12", "--guard.audit_at_start", "false")
    trainer = GRPOTrainer.from_settings(cfg)
    adapter, batch = trainer.adapter, trainer.data.batch(0)
    torch.manual_seed(0)
    prompts, drawn = encode(adapter, batch.samples, "cpu"), TokenLogps(temperature)
    with sampling_with(adapter.model, cfg.generation):
        ro = rollout(adapter, batch.samples, cfg.generation, 4, "cpu", prompts=prompts, token_logps=drawn)
    rows = list(range(len(ro.completions)))
    with torch.no_grad():
        forward = group_scores(adapter, prompts, ro.prompt_index(rows), ro.completion_ids, ro.completion_mask,
                               adapter.model, trainer.scorer.options()).logps
    during = drawn.tensor()
    mask = ro.completion_mask.bool()
    assert during.shape == forward.shape and mask.sum() > 8
    assert (during - forward)[mask].abs().max() < 1e-4


def test_no_batch_is_trained_on_more_than_k_steps_after_its_weights(tmp_path, monkeypatch):
    """With dynamic sampling a step may take several batches: requested ahead, or (the queue used up) now."""
    extra = ["--reward", "tests/grpo/toy_rewards.py:lowercase_share_on_even_counts", "--data.dynamic_sampling", "true"]
    seen, original = [], AsyncDraws.next

    def watched(self, step):
        draw = original(self, step)
        seen.append((step, draw.version, draw.index))
        return draw

    monkeypatch.setattr(AsyncDraws, "next", watched)
    rows = trained(GRPOTrainer.from_settings(run_config(
        tmp_path, *MODEL, "--max-steps", "5", "--learning-rate", "3e-3", "--rollout.max_staleness", "2", *extra)))
    assert [index for _, _, index in seen] == list(range(len(seen)))  # the run's order, each batch once
    assert all(0 <= step - version <= 2 for step, version, _ in seen) and len(seen) > 5  # some steps took more
    ages = {}
    for step, version, _ in seen:
        ages[step] = max(ages.get(step, 0), step - version)
    assert [r["async/staleness"] for r in rows] == [float(ages[s]) for s in range(5)]
    moved = [r["sampling/sampling_logp_difference/max"] for r in rows if r["async/staleness"] > 0]
    assert max(moved) > 0  # stale weights sampled: the correction has something to correct


def _comparable(rows):
    return [{k: v for k, v in r.items() if k not in ("step_time", "async/wait_s")} for r in rows]


def test_resume_restores_the_queue_and_gives_the_same_weights(tmp_path):
    common = [*MODEL, "--max-steps", "4", "--learning-rate", "3e-3", "--rollout.max_staleness", "1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    rows = trained(GRPOTrainer.from_settings(run_config(straight, *common)))
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    trained(GRPOTrainer.from_settings(run_config(split, *common, "--save-every", "2")))
    queued = (split / "checkpoint-2" / "rollout_queue.json")
    assert queued.is_file() and '"index": 2' in queued.read_text()  # batch 2, sampled before step 2 was trained
    for extra in ("checkpoint-4", "final"):  # the run died after checkpoint-2
        shutil.rmtree(split / extra)
    lines = (split / "metrics.jsonl").read_text().splitlines()
    (split / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    trained(GRPOTrainer.from_settings(run_config(split, *common, "--save-every", "2", "--resume")))
    a, b = weights(straight / "final"), weights(split / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _comparable(read_jsonl(straight / "metrics.jsonl")) == _comparable(read_jsonl(split / "metrics.jsonl"))


def test_a_worker_that_dies_is_named_and_the_completed_step_kept(tmp_path, monkeypatch):
    from vlm_grpo.grpo.loop.grpo_stage import GRPOStage

    original = GRPOStage.train_step

    def killing(self, step):
        metrics = original(self, step)
        if step == 0:
            self.draws.worker.process.kill()
            self.draws.worker.process.join()
        return metrics

    monkeypatch.setattr(GRPOStage, "train_step", killing)
    common = [*MODEL, "--max-steps", "3", "--rollout.max_staleness", "1"]
    # batch 1 may have been answered before the kill: the run stops at the first batch that was not
    with pytest.raises(WorkerFailed, match=r"rollout worker exited \(code -9\) before answering rollout batch [12]$"):
        trained(GRPOTrainer.from_settings(run_config(tmp_path, *common)))
    done = len(read_jsonl(tmp_path / "metrics.jsonl"))
    assert done in (1, 2) and (tmp_path / f"checkpoint-{done}").is_dir()  # the completed steps, saved
    monkeypatch.setattr(GRPOStage, "train_step", original)
    rows = trained(GRPOTrainer.from_settings(run_config(tmp_path, *common, "--resume")))
    assert [r["step"] for r in rows] == list(range(done + 1, 4))  # what the dead worker had not answered: sampled again


@pytest.mark.parametrize("extra, named", [
    (["--rollout.engine", "vllm"], "vllm_mode colocate"),
    (["--steps-per-generation", "2"], "steps_per_generation"),
    (["--fsdp", "full_shard"], "fsdp"),
])
def test_what_asynchronous_rollouts_cannot_take_is_refused_before_a_model_loads(tmp_path, extra, named):
    with pytest.raises(SettingError, match=rf"rollout.max_staleness.*{named}"):
        run_config(tmp_path, *MODEL, "--rollout.max_staleness", "1", *extra)


@pytest.mark.parametrize("setting", [["--rollout.max_staleness", "1"], ["--data.dynamic_sampling", "true"]])
def test_tool_rollouts_are_refused_naming_the_setting(tmp_path, setting):
    cfg = run_config(tmp_path, *MODEL, "--recipe", "zoom", "--data.recipe_options", "{}", *setting)
    with pytest.raises(SettingError, match=rf"{setting[0][2:]}.*tool rollouts"):
        GRPOTrainer.from_settings(cfg)
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_the_loss_on_stale_samples_is_the_hand_computed_one(mode):
    """dapo's clipped surrogate over step tokens, each token's term times the bounded ratio of the trainer's (old)
    to the worker's (behaviour) probabilities, written out element by element."""
    g = torch.Generator().manual_seed(3)
    rows, width = 4, 5
    logps = (-torch.rand(rows, width, generator=g) * 2).requires_grad_(True)
    old = logps.detach() + torch.randn(rows, width, generator=g) * 0.1
    behaviour = old + torch.randn(rows, width, generator=g) * 0.6  # some ratios beyond the bounds
    mask = torch.ones(rows, width)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0])
    low, high = 0.5, 1.5
    correction = sampling_correction(old, behaviour, mask, mode, low, high)
    cfg = LossConfig(loss_type="dapo")
    loss, _ = PolicyObjective(cfg)(LossInputs(logps, adv, mask, old_logps=old, sampling_logps=behaviour,
                                              sampling_ratio=correction.ratio))

    def weight(i, t):
        if mode.startswith("token"):
            w = math.exp(old[i, t] - behaviour[i, t])
        else:
            w = math.exp(sum(float(old[i, u] - behaviour[i, u]) for u in range(width) if mask[i, u]))
        if low <= w <= high:
            return w
        return min(max(w, low), high) if mode.endswith("truncate") else 0.0

    total, tokens, outside = 0.0, 0, 0
    for i in range(rows):
        for t in range(width):
            if not mask[i, t]:
                continue
            r = math.exp(float(logps[i, t] - old[i, t]))
            a = float(adv[i])
            term = -min(r * a, min(max(r, 1 - cfg.epsilon), 1 + cfg.epsilon) * a)
            total += term * weight(i, t)
            tokens += 1
    assert loss.item() == pytest.approx(total / tokens, rel=1e-5)
    for i in range(rows):
        raw = math.exp(sum(float(old[i, u] - behaviour[i, u]) for u in range(width) if mask[i, u]))
        outside += not low <= raw <= high
    if mode.startswith("sequence"):
        assert correction.clipped_share == pytest.approx(outside / rows)
