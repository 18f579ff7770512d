"""vLLM's truncated importance-sampling correction against TRL 1.16's own code, in float64, within 1e-10.

TRL computes the ratio and its statistics inline in `GRPOTrainer._generate_and_score_completions` (a method that
also generates, so not callable on a stand-in): the two blocks are taken from TRL's installed source and run on the
same tensors as ours. The loss with the ratio applied runs through TRL's `_compute_loss` (as test_loss_parity_trl).
No vLLM is needed.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402

from tests.grpo.test_loss_parity_trl import B, T, TOL, _trl_trainer, config, make_case  # noqa: E402
from vlm_grpo.grpo.algorithm.losses import EntropyControl, LossInputs, policy_loss  # noqa: E402
from vlm_grpo.grpo.algorithm.sampling_correction import sampling_correction  # noqa: E402

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
BOUNDS = [(None, 3.0), (0.5, 2.0), (0.8, None)]


def _trl_block(first_line: str) -> str:
    """The body of the `if self.use_vllm and self.vllm_importance_sampling_correction:` block of
    `_generate_and_score_completions` whose first statement starts with `first_line`."""
    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(first_line))
    header = lines[start - 1]
    assert header.strip() == "if self.use_vllm and self.vllm_importance_sampling_correction:", header
    indent = len(header) - len(header.lstrip())
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return textwrap.dedent("\n".join(body))


class _Accelerator:
    @staticmethod
    def gather(x):
        return x.reshape(1) if x.dim() == 0 else x


def trl_correction(trainer, sampling, mask, mode, clip_min, clip_max):
    """TRL's ratio and logged statistics, by TRL's code."""
    this = SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
                           vllm_importance_sampling_clip_max=clip_max, accelerator=_Accelerator(),
                           _metrics={"train": defaultdict(list)})
    scope = dict(self=this, old_per_token_logps=trainer, sampling_per_token_logps=sampling, completion_mask=mask,
                 tool_mask=None, torch=torch, math=math, device=trainer.device, mode="train",
                 nanmin=lambda x: torch.min(x[~torch.isnan(x)]), nanmax=lambda x: torch.max(x[~torch.isnan(x)]))
    exec(_trl_block("mask = completion_mask if tool_mask is None"), scope)
    exec(_trl_block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)"), scope)
    return scope["vllm_importance_sampling_ratio"], {k: v[-1] for k, v in this._metrics["train"].items()}


def _engine_logps(case, seed: int) -> torch.Tensor:
    """The sampling engine's log-probs: the trainer's, off by ~0.8 nats, one token unscored (NaN)."""
    g = torch.Generator().manual_seed(seed)
    trainer = case.logps().detach()
    engine = trainer + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    engine[0, 1] = float("nan")
    return engine


@pytest.mark.parametrize("clip_min, clip_max", BOUNDS)
@pytest.mark.parametrize("mode", MODES)
def test_ratio_and_statistics_match_trl(mode, clip_min, clip_max):
    case = make_case(3)
    trainer = case.logps().detach()
    engine = _engine_logps(case, 4)
    theirs, trl_metrics = trl_correction(trainer, engine, case.mask, mode, clip_min, clip_max)
    ours = sampling_correction(trainer, engine, case.mask, mode, clip_min, clip_max)
    assert ours.ratio.shape == theirs.shape == ((B, 1) if mode.startswith("sequence") else (B, T))
    assert (ours.ratio - theirs).abs().max().item() <= TOL
    assert set(trl_metrics) == set(ours.metrics)
    for key, value in trl_metrics.items():
        assert ours.metrics[key] == pytest.approx(value, abs=TOL), key
    # the bounds bite: some ratio is clipped or zeroed, and some is not
    raw = sampling_correction(trainer, engine, case.mask, mode, None, None).ratio
    assert not torch.equal(raw, ours.ratio) and torch.isfinite(ours.ratio).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_loss_with_the_correction_matches_trl(loss_type, mode):
    """The ratio multiplies the per-token loss where TRL's does (after the masks, before the KL term); the off-policy
    mask compares with the engine's log-probs."""
    cfg = config(loss_type=loss_type, beta=0.04, off_policy_mask_threshold=0.05)
    case = make_case(5, off_policy=False)
    trainer = case.logps().detach()
    engine = _engine_logps(case, 6)
    correction = sampling_correction(trainer, engine, case.mask, mode, None, 2.0)

    fake = _trl_trainer(cfg)
    fake.use_vllm = fake.vllm_importance_sampling_correction = True
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (case.logps(), case.entropy(), None)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": case.completion_ids, "completion_mask": case.mask, "advantages": case.advantages,
        "num_items_in_batch": torch.tensor(float(case.mask.sum()), dtype=torch.float64),
        "ref_per_token_logps": case.ref, "old_per_token_logps": trainer,
        "sampling_per_token_logps": engine, "importance_sampling_ratio": correction.ratio,
    }
    theirs = GRPOTrainer._compute_loss(fake, None, inputs)
    (grad_theirs,) = torch.autograd.grad(theirs, case.logits)
    ours, _ = policy_loss(LossInputs(case.logps(), case.advantages, case.mask, old_logps=trainer, ref_logps=case.ref,
                                     entropy=case.entropy(), sampling_logps=engine, sampling_ratio=correction.ratio),
                          cfg, entropy_control=EntropyControl(cfg))
    (grad_ours,) = torch.autograd.grad(ours, case.logits)
    assert abs(ours.item() - theirs.item()) <= TOL
    assert (grad_ours - grad_theirs).abs().max().item() <= TOL and grad_theirs.abs().max().item() > 1e-3
    plain, _ = policy_loss(LossInputs(case.logps(), case.advantages, case.mask, old_logps=trainer, ref_logps=case.ref,
                                      entropy=case.entropy()), cfg, entropy_control=EntropyControl(cfg))
    assert abs(plain.item() - ours.item()) > 1e-6  # the correction changed the loss
