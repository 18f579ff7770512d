"""SFT's update: one optimizer update on a batch's reference completions (mean NLL over their tokens), over
micro-batches; with `sft.eval_every N`, a greedy held-out evaluation every N steps and at the end."""

from __future__ import annotations

import logging
from typing import Any

from vlm_grpo.grpo.heldout_eval import heldout_metrics
from vlm_grpo.grpo.sft import build_sft_batch, completion_nll

log = logging.getLogger(__name__)


class SupervisedUpdate:
    def __init__(self, ctx, policy, evaluation):
        self.ctx, self.cfg, self.policy, self.evaluation = ctx, ctx.cfg, policy, evaluation

    def run(self, samples: list, step: int) -> dict[str, Any]:
        cfg, acc, policy = self.cfg, self.ctx.accelerator, self.policy
        adapter = policy.adapter
        dtype = next(adapter.model.parameters()).dtype
        batch = build_sft_batch(adapter, samples, cfg.sft.max_reference_tokens).to(acc.device, dtype=dtype)
        rows = list(range(len(batch)))
        per = len(rows) // cfg.gradient_accumulation_steps
        chunks = [rows[i : i + per] for i in range(0, len(rows), per)]
        # The mean over the step's completion tokens; DDP averages gradients, so scale by the process count.
        tokens = acc.reduce(batch.completion_mask.sum().float(), reduction="sum") / acc.num_processes
        policy.zero_grad()
        nll_sum = hit_sum = 0.0
        for k, chunk in enumerate(chunks):
            with policy.accumulating(last=k == len(chunks) - 1):
                total, _, hits = policy.forward(lambda m: completion_nll(adapter, batch.select(chunk), model=m))
                acc.backward(total / tokens)
            nll_sum += total.item()
            hit_sum += hits.item()
        grad_norm, was_skipped = policy.update(cfg.optim, step + 1)
        if was_skipped:
            log.warning("sft step %d: %s", step + 1, policy.skip_reason())
        policy.scheduler.step()
        policy.zero_grad()
        n = batch.completion_mask.sum().item()
        metrics = self.ctx.mean_over_processes({
            "loss": nll_sum / max(n, 1),
            "token_accuracy": hit_sum / max(n, 1),
            "completion_length": batch.completion_mask.sum(1).float().mean().item(),
            "grad_norm": float(grad_norm),
            "skipped_updates": int(was_skipped),
            "undone_updates": int(bool(policy.undone)),
            **policy.learning_rates(),
        })
        every = cfg.sft.eval_every
        if every > 0 and ((step + 1) % every == 0 or step + 1 == cfg.max_steps):
            report = self.evaluation.evaluate(step + 1)
            metrics.update(heldout_metrics(report))
            self.evaluation.reports.clear()  # the newest evaluation only, for the model card
            self.evaluation.reports[f"step {step + 1}"] = report
        metrics["step"] = step + 1
        return metrics
