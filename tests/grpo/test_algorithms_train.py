"""Every registered loss and advantage estimator trains on a tiny twin; the options that live in the step (the
entropy bonus's gradient, mask_truncated_completions, sync_ref_model) do what TRL does there."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.grpo.algorithm import reference_sync
from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES
from vlm_grpo.grpo.algorithm.losses import LOSSES
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

TINY = ["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
        "--batch-size", "2", "--num-generations", "2", "--logging.progress", "false", "--log-completions", "false",
        "--data.rewards", "tests.grpo.toy_rewards:lowercase_share"]
# Each registered loss once, each estimator at least twice, and each option of the shared objective through a real
# step. OPTIONS pairs a loss with an estimator and options; a loss it does not name (a new file) runs with defaults
# and the estimator its place in the registry's order gives.
OPTIONS = {
    "bnpo": ("group", ["--delta", "1.5", "--num-iterations", "2"]),
    "cispo": ("rloo", ["--loss.epsilon_high", "5.0", "--top-entropy-quantile", "0.5"]),
    "dapo": ("reinforce_pp", ["--off-policy-mask-threshold", "0.01", "--num-iterations", "2"]),
    "dr_grpo": ("reinforce_pp_baseline", ["--beta", "0.04", "--use-bias-correction-kl", "false"]),
    "gmpo": ("group", ["--gradient-accumulation-steps", "2"]),
    "grpo": ("rloo", ["--importance-sampling-level", "sequence", "--num-iterations", "2"]),
    "luspo": ("reinforce_pp", ["--importance-sampling-level", "sequence"]),
    "sapo": ("reinforce_pp_baseline", ["--entropy-coef", "0.01"]),
    "vespo": ("group", ["--use-adaptive-entropy", "true", "--beta", "0.04", "--sync-ref-model", "true",
                        "--ref-model-sync-steps", "1"]),
}
RUNS = {name: OPTIONS.get(name, (sorted(ADVANTAGES)[k % len(ADVANTAGES)], [])) for k, name in enumerate(sorted(LOSSES))}
OWN_METRIC = {"cispo": "cispo_clip_ratio", "vespo": "vespo/phi_seq_mean", "gmpo": "gmpo/clip_fraction"}


def config(out: Path, *overrides: str):
    return load_config(overrides=["--output-dir", str(out), *TINY, *overrides])


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_matrix_covers_the_registries():
    assert set(OPTIONS) <= set(LOSSES), "options for a loss that is no longer registered"
    counts = [advantage for advantage, _ in RUNS.values()]
    assert all(counts.count(name) >= 2 for name in ADVANTAGES)


@pytest.mark.parametrize("loss_type", sorted(RUNS))
def test_every_loss_and_estimator_trains_two_steps(tmp_path, loss_type):
    advantage, options = RUNS[loss_type]
    trainer = GRPOTrainer.from_settings(config(tmp_path, "--max-steps", "2", "--loss-type", loss_type, "--advantage", advantage,
                                 *options))
    before = params(trainer.adapter.model)
    history = trained(trainer)
    assert [m["step"] for m in history] == [1, 2]
    after = dict(trainer.adapter.model.named_parameters())
    assert any(not torch.equal(before[n], p) for n, p in after.items())  # the policy moved
    for m in history:
        assert torch.isfinite(torch.tensor([m["loss"], m["grad_norm"]])).all()
        assert m["skipped_updates"] == 0
    key = "clip_ratio/region_mean" if issubclass(LOSSES[loss_type], ClippedSurrogate) else OWN_METRIC.get(loss_type, "loss")
    assert key in history[0], key
    assert ("kl" in history[0]) == ("--beta" in options)
    assert ("entropy_coef" in history[0]) == any(o.startswith("--entropy-coef") or "adaptive" in o for o in options)


def test_the_command_line_trains_with_cispo_and_rloo_on_the_default_recipe(tmp_path):
    from vlm_grpo.cli import main

    assert main(["train", "--loss-type", "cispo", "--advantage", "rloo", "--max-steps", "1", "--output-dir",
                 str(tmp_path), "--eval.before_after", "false", "--logging.plot", "false", "--logging.progress",
                 "false"]) == 0
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "stage" not in r]
    assert [r["step"] for r in rows] == [1] and "cispo_clip_ratio" in rows[0]
    saved = (tmp_path / "config.yaml").read_text()
    assert "loss_type: cispo" in saved and "advantage: rloo" in saved and "recipe: shapes" in saved


def test_the_entropy_bonus_alone_moves_the_policy(tmp_path):
    """A constant reward (no advantage anywhere) and no KL: only the entropy bonus has a gradient. It had none when
    the entropy was taken without one, and the policy stayed put."""
    common = ["--max-steps", "1", "--data.rewards", "tests.grpo.toy_rewards:record_steps", "--learning-rate", "1e-2"]
    trainer = GRPOTrainer.from_settings(config(tmp_path / "bonus", *common, "--entropy-coef", "0.5"))
    before = params(trainer.adapter.model)
    history = trained(trainer)
    assert history[0]["frac_reward_zero_std"] == 1.0 and history[0]["grad_norm"] > 0
    moved = [n for n, p in trainer.adapter.model.named_parameters() if not torch.equal(before[n], p)]
    assert any(trainer.adapter.module_group_of(n) == "head" for n in moved)
    plain = GRPOTrainer.from_settings(config(tmp_path / "plain", *common))
    assert trained(plain)[0]["grad_norm"] == 0.0


def trl_truncated(completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_and_pad: list[int]) -> torch.Tensor:
    """TRL 1.16's rule (`_generate_and_score_completions`): the completion, cut after its first EOS, does not end in
    EOS or pad."""
    completion_ids_list = [row[m.bool()].tolist() for row, m in zip(completion_ids, completion_mask)]
    return torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids_list])


def test_mask_truncated_completions_drops_the_rows_trl_drops(tmp_path):
    """A real rollout where some completions stop (EOS: tokens the first rollout sampled, made EOS for the second,
    which samples the same tokens) and others hit max_new_tokens: the trajectory's loss mask is the completion mask
    less the rows TRL's rule calls truncated."""
    trainer = GRPOTrainer.from_settings(config(tmp_path, "--mask-truncated-completions", "true", "--num-generations", "4",
                                 "--max-new-tokens", "6"))
    batch = trainer.data.batch(0)
    torch.manual_seed(7)
    first = trainer.sampler.sample(batch.samples, batch.rows, 0).rollout
    ids = first.completion_ids
    # row 0 stops at its third token, row 1 exactly at its last: EOS ids for the second rollout
    generation_config = trainer.adapter.model.generation_config
    stops = [int(ids[0, 2]), int(ids[1, -1])]
    generation_config.eos_token_id = stops
    torch.manual_seed(7)
    sampled = trainer.sampler.sample(batch.samples, batch.rows, 0)
    ro, traj = sampled.rollout, trainer.scoring.score(batch.samples, batch.rows, sampled, 0).trajectory
    truncated = trl_truncated(ro.completion_ids, ro.completion_mask, [*stops, trainer.adapter.pad_token_id])
    assert torch.equal(traj.loss_mask, ro.completion_mask * (~truncated).unsqueeze(1).to(ro.completion_mask.dtype))
    assert not truncated[0] and not truncated[1] and truncated.any()  # both kinds present
    assert ro.completion_mask[1].sum() == 6 and traj.loss_mask[1].sum() == 6  # EOS as the last token: kept
    assert traj.loss_mask[truncated].sum() == 0 and traj.completion_mask[truncated].sum() > 0


def test_reference_sync_is_trl_s_callback():
    from trl.trainer.callbacks import SyncRefModelCallback

    from tests.conftest import tiny_adapter

    policy = tiny_adapter("qwen2_5_vl").model
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(0.5).add_(0.1)
    theirs, ours = copy.deepcopy(reference), copy.deepcopy(reference)
    SyncRefModelCallback._sync_target_model(policy, theirs, 0.6)
    reference_sync.mix(ours, policy, 0.6)
    pairs = list(zip(theirs.parameters(), ours.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in pairs)
    assert any(not torch.equal(a, b) for a, b in zip(ours.parameters(), reference.parameters()))


def test_sync_ref_model_moves_the_reference_at_trl_s_update_counts_and_resumes_from_it(tmp_path):
    """Every 2 optimizer updates (TRL: global_step % ref_model_sync_steps == 0 at each step's end) the reference
    becomes alpha x policy + (1 - alpha) x reference; checkpoints keep it, and a run resumed from checkpoint-3 ends
    bit-identical to the uninterrupted one (a fresh reference would change the KL of step 4)."""
    from trl.trainer.callbacks import SyncRefModelCallback

    common = ["--max-steps", "4", "--beta", "0.04", "--learning-rate", "1e-2", "--sync-ref-model", "true",
              "--ref-model-sync-steps", "2", "--ref-model-mixup-alpha", "0.5"]
    straight = GRPOTrainer.from_settings(config(tmp_path / "straight", *common, "--save-every", "1", "--keep-checkpoints", "0"))
    expected = copy.deepcopy(straight.reference)  # the starting reference: the policy as it was
    trained(straight)

    def reference_at(step: int) -> dict[str, torch.Tensor]:
        return load_file(tmp_path / "straight" / f"checkpoint-{step}" / reference_sync.FILE)

    def policy_at(step: int) -> torch.nn.Module:
        return type(straight.adapter.model).from_pretrained(tmp_path / "straight" / f"checkpoint-{step}")

    for step in (1, 2, 3, 4):
        if step % 2 == 0:
            SyncRefModelCallback._sync_target_model(policy_at(step), expected, 0.5)
        saved = reference_at(step)
        assert all(torch.equal(saved[n], p) for n, p in expected.state_dict().items()), step
    assert not all(torch.equal(reference_at(1)[n], t) for n, t in reference_at(2).items())
    assert all(torch.equal(p, q) for p, q in zip(straight.reference.parameters(), expected.parameters()))

    resumed = GRPOTrainer.from_settings(config(tmp_path / "resumed", *common, "--resume-from",
                                 str(tmp_path / "straight" / "checkpoint-3")))
    trained(resumed)
    a, b = load_file(tmp_path / "straight" / "final" / "model.safetensors"), \
        load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(p, q) for p, q in zip(straight.reference.parameters(), resumed.reference.parameters()))
