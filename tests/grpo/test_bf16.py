"""mixed_precision bf16: the weights stored in bf16 (policy, reference, rollout), float32 master weights stepped by the
optimizer, exact resume from the masters, and the rollout's log-probs within a stated tolerance of the trainer's."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.adapters.samples import mixed_batch
from tests.grpo.test_sharing import _prompts
from tests.trained import trained
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.adapters.sharing import generate_shared
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.logprobs.completions import group_scores, token_logprobs
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.training.precision import MASTER_FILE, MasterWeights, accelerator_precision, stores_bf16

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false",
        "--model", "tiny:qwen2_5_vl", "--bf16", "true"]

# Rollout (cached decode, bf16 weights) against the trainer's teacher-forced forward over the same bf16 weights:
# the same products in another order and shape, so bf16's rounding differs. Measured on the tiny twins: at most
# 0.002 per token, 0.0002-0.0004 on average.
ROLLOUT_TOLERANCE_MAX, ROLLOUT_TOLERANCE_MEAN = 1e-2, 1e-3


def test_masters_step_as_float32_adamw_would_on_the_same_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(torch.bfloat16)
    reference = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    masters = MasterWeights(model)
    assert len(masters) == 2 and all(m.dtype == torch.float32 for m in masters.masters)
    optimizer = torch.optim.AdamW(masters.param_groups([{"params": list(model.parameters())}]), lr=1e-5)
    theirs = torch.optim.AdamW(reference, lr=1e-5)
    buffers = None
    for _ in range(3):
        x = torch.randn(4, 16, dtype=torch.bfloat16)
        model(x).float().square().sum().backward()
        for r, p in zip(reference, model.parameters()):
            r.grad = p.grad.float()
        masters.gradients_in()
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(m.grad, r.grad) for m, r in zip(masters.masters, reference))
        # one fp32 gradient buffer per master, kept across updates (zero_grad drops the optimizer's reference only)
        pointers = [m.grad.data_ptr() for m in masters.masters]
        assert buffers is None or pointers == buffers
        buffers = pointers
        optimizer.step(), theirs.step()
        masters.weights_out()
        optimizer.zero_grad(), theirs.zero_grad()
    for master, r, weight in zip(masters.masters, reference, model.parameters()):
        assert torch.equal(master, r.detach())  # float32 AdamW, exactly
        assert torch.equal(weight, master.to(torch.bfloat16))


def test_which_runs_store_bf16_weights():
    assert stores_bf16(load_config(overrides=["--bf16", "true"]))
    assert accelerator_precision(load_config(overrides=["--bf16", "true"])) == "no"  # no autocast over bf16 weights
    assert not stores_bf16(load_config(overrides=[]))
    four_bit = load_config(overrides=["--bf16", "true", "--lora.r", "4", "--load-in-4bit", "true"])
    assert not stores_bf16(four_bit) and accelerator_precision(four_bit) == "bf16"  # bitsandbytes' own compute dtype


def test_a_bf16_run_multiplies_bf16_weights_and_steps_float32_masters(tmp_path):
    trainer = GRPOTrainer.from_settings(load_config(overrides=["--output-dir", str(tmp_path), *FAST,
                                                               "--max-steps", "2", "--beta", "0.04"]))
    model = trainer.policy.model
    assert trainer.ctx.accelerator.mixed_precision == "no"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if p.is_floating_point())
    assert all(p.dtype == torch.bfloat16 for p in trainer.reference.parameters())
    before = [m.detach().clone() for m in trainer.policy.masters.masters]
    history = trained(trainer)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    optimized = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert optimized and all(p.dtype == torch.float32 for p in optimized)
    assert {id(p) for p in optimized} == {id(m) for m in trainer.policy.masters.masters}
    assert any(not torch.equal(b, m) for b, m in zip(before, trainer.policy.masters.masters))
    for weight, master in zip(trainer.policy.masters.weights, trainer.policy.masters.masters):
        assert torch.equal(weight.detach(), master.detach().to(torch.bfloat16))
    assert (tmp_path / "checkpoint-2" / MASTER_FILE).is_file()


def test_a_bf16_run_resumes_exactly_from_its_masters(tmp_path):
    common = [*FAST, "--learning-rate", "1e-3", "--max-steps", "4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    trained(GRPOTrainer.from_settings(load_config(overrides=["--output-dir", str(straight), *common])))
    trained(GRPOTrainer.from_settings(load_config(overrides=["--output-dir", str(split), *common, "--save-every", "2"])))
    for extra in ("checkpoint-4", "final"):  # the run died after checkpoint-2
        shutil.rmtree(split / extra)
    lines = (split / "metrics.jsonl").read_text().splitlines()
    (split / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")
    trained(GRPOTrainer.from_settings(load_config(overrides=["--output-dir", str(split), *common, "--resume"])))
    drop = ("step_time",)
    rows = [[{k: v for k, v in r.items() if k not in drop} for r in read_jsonl(d / "metrics.jsonl")]
            for d in (straight, split)]
    assert rows[0] == rows[1]
    from safetensors.torch import load_file

    a, b = (load_file(d / "checkpoint-4" / MASTER_FILE) for d in (straight, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3", "internvl"])
def test_rollout_logprobs_in_bf16_are_within_tolerance_of_the_trainers(family):
    adapter = family_class(family).tiny(seed=0)
    adapter.model.to(torch.bfloat16)
    prompts = _prompts(adapter).to("cpu", dtype=torch.bfloat16)
    torch.manual_seed(0)
    out = generate_shared(adapter, prompts, 4, max_new_tokens=12, min_new_tokens=12, do_sample=True, use_cache=True,
                          output_logits=True)
    completion = out.output.sequences[:, prompts.input_ids.shape[1]:]
    sampled = token_logprobs(torch.stack(out.output.logits, 1), completion)
    with torch.no_grad():
        trainer = group_scores(adapter, prompts, [i for i in range(len(prompts)) for _ in range(4)], completion,
                               torch.ones_like(completion)).logps
    diff = (trainer - sampled).abs()
    assert diff.max().item() <= ROLLOUT_TOLERANCE_MAX and diff.mean().item() <= ROLLOUT_TOLERANCE_MEAN


def test_every_family_trains_and_samples_with_bf16_weights(family):
    """Weights cast as the run casts them (buffers kept, as from_pretrained(dtype=bfloat16) keeps a rotary table in
    float32): a sampled rollout and a scored, differentiated forward run, and the gradients are bf16."""
    from vlm_grpo.grpo.training.precision import to_bf16

    adapter = family_class(family).tiny(seed=0)
    buffers = {n: b.dtype for n, b in adapter.model.named_buffers()}
    to_bf16(adapter.model)
    assert all(p.dtype == torch.bfloat16 for p in adapter.model.parameters() if p.is_floating_point())
    assert {n: b.dtype for n, b in adapter.model.named_buffers()} == buffers
    prompts = adapter.encode_prompts(*mixed_batch(adapter)).to("cpu", dtype=torch.bfloat16)
    out = generate_shared(adapter, prompts, 2, max_new_tokens=4, min_new_tokens=4, do_sample=True, use_cache=None)
    completion = out.output.sequences[:, prompts.input_ids.shape[1]:]
    scores = group_scores(adapter, prompts, [i for i in range(len(prompts)) for _ in range(2)], completion,
                          torch.ones_like(completion))
    assert torch.isfinite(scores.logps).all()
    scores.logps.sum().backward()
    grads = [p.grad for p in adapter.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.bfloat16 for g in grads)


def test_sft_in_bf16_learns_through_its_masters(tmp_path):
    """The SFT stage takes the same update: bf16 weights, float32 masters; the loss halves in 20 steps, as in float32."""
    from vlm_grpo.cli import main

    out = tmp_path / "sft"
    assert main(["sft", "--model", "tiny:qwen2_5_vl", "--recipe", "shapes", "--train-size", "4", "--batch-size", "4",
                 "--max-steps", "20", "--learning-rate", "3e-3", "--freeze", "vision", "--bf16", "true",
                 "--output-dir", str(out), "--data.recipe_options", "{image_size: 56}", "--logging.progress",
                 "false"]) == 0
    losses = [m["loss"] for m in read_jsonl(out / "metrics.jsonl")]
    assert losses[-1] < 0.5 * losses[0], losses
    assert any(out.glob(f"checkpoint-*/{MASTER_FILE}"))  # the masters travel with the checkpoints


def test_a_run_after_another_precision_in_the_same_process_starts(tmp_path):
    """accelerate's process-wide state keeps the first precision it was given (a TRL trainer's bf16 autocast, say):
    a run of another precision in the same process takes it over instead of failing at its start."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # as transformers' TrainingArguments does before a TRL trainer's accelerator
    Accelerator(cpu=True, mixed_precision="bf16")  # what TRL's bf16=True leaves behind
    trainer = GRPOTrainer.from_settings(load_config(overrides=["--output-dir", str(tmp_path), *FAST, "--max-steps", "1"]))
    assert trainer.ctx.accelerator.mixed_precision == "no"  # bf16 weights: no autocast over them
    assert len(trained(trainer)) == 1
