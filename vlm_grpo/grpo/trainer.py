"""The shared GRPO loop. It asks the adapter for everything model-specific and knows no family.

One step: pick B prompts -> encode once -> sample G completions each -> score (named rewards) ->
group advantages -> log-probs (old, reference) -> `num_iterations` clipped-ratio updates.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from vlm_grpo.adapters.registry import load_adapter
from vlm_grpo.grpo import checkpoint as ckpt
from vlm_grpo.grpo.advantages import group_advantages
from vlm_grpo.grpo.config import TrainConfig
from vlm_grpo.grpo.data_order import batch_indices, step_seed
from vlm_grpo.grpo.logprobs import completion_logits, token_logprobs
from vlm_grpo.grpo.lora import apply_lora, is_lora_wrapped, reference_disabled, save_merged
from vlm_grpo.grpo.loss import grpo_loss
from vlm_grpo.grpo.optim import apply_freeze, build_optimizer, build_scheduler, clip_gradients, trainable_table
from vlm_grpo.grpo.rewards import parse_reward_specs, score
from vlm_grpo.grpo.rollout import Rollout, rollout
from vlm_grpo.grpo.run_log import RunLog
from vlm_grpo.recipes import get_recipe

log = logging.getLogger(__name__)


def load_policy(cfg: TrainConfig, device: torch.device):
    spec = cfg.model.init_from or cfg.model.name
    adapter = load_adapter(
        spec,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        device=None if device.type == "cpu" else str(device),
        attn_implementation=cfg.model.attn_implementation,
        load_in_4bit=cfg.lora.load_in_4bit,
        trust_remote_code=cfg.model.trust_remote_code,
        cache_policy=cfg.model.cache_policy,
    )
    adapter.cache_policy = cfg.model.cache_policy
    if not cfg.lora.load_in_4bit:
        adapter.model.to(device)
    return adapter


def entropy_of(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return (ent * mask).sum() / mask.sum().clamp(min=1)


class GRPOTrainer:
    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None):
        self.cfg = cfg
        cfg.loss.max_completion_length = cfg.generation.max_new_tokens
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # lets torchrun-launched CPU processes form a gloo group
            mixed_precision=cfg.mixed_precision,
            log_with=cfg.logging.report_to or None,
            project_dir=cfg.logging.output_dir,
        )
        set_seed(cfg.seed)
        self.run_dir = Path(cfg.logging.output_dir)
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            probe = self.run_dir / ".write-test"
            probe.write_text("ok")  # fail now, not at the first checkpoint, if the directory is unwritable
            probe.unlink()
        self.recipe = recipe or get_recipe(cfg.data.recipe)
        self.rewards = parse_reward_specs(cfg.data.rewards) if cfg.data.rewards else list(self.recipe.rewards)
        self.dataset = self.recipe.build(split="train", size=cfg.data.train_size, seed=cfg.seed, **cfg.data.recipe_options)
        self.adapter = adapter or load_policy(cfg, self.accelerator.device)
        self._setup_training()
        self.log = RunLog(self.run_dir, enabled=self.is_main)
        self.step = 0

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    # ---------------------------------------------------------------- setup
    def _setup_training(self) -> None:
        cfg, adapter = self.cfg, self.adapter
        if cfg.lora.r > 0:
            apply_lora(adapter, cfg.lora)
        else:
            apply_freeze(adapter, cfg.optim)
        self.reference = None
        if cfg.loss.beta > 0 and not is_lora_wrapped(adapter):
            # A frozen in-memory copy: never reloaded from disk by name.
            self.reference = copy.deepcopy(adapter.model).eval().requires_grad_(False)
        adapter.model.eval()  # no dropout: the ratio compares like with like
        optimizer = build_optimizer(adapter, cfg.optim)
        self.scheduler = build_scheduler(optimizer, cfg.optim, total_steps=cfg.max_steps * cfg.num_iterations)
        self.model, self.optimizer = self.accelerator.prepare(adapter.model, optimizer)
        if self.is_main:
            print(trainable_table(adapter, cfg.optim))

    # ---------------------------------------------------------------- one step
    def _samples(self, step: int):
        acc = self.accelerator
        idx = batch_indices(len(self.dataset), self.cfg.data.batch_size, step, self.cfg.seed, acc.process_index, acc.num_processes)
        return [self.dataset[i] for i in idx], idx

    def _logprobs(self, ro: Rollout, rows: list[int], model, with_logits: bool = False):
        logits = completion_logits(self.adapter, ro.grouped.select(rows), ro.completion_ids[rows], ro.completion_mask[rows], model=model)
        logps = token_logprobs(logits, ro.completion_ids[rows])
        return (logps, logits) if with_logits else logps

    def _reference_logprobs(self, ro: Rollout, rows: list[int]) -> torch.Tensor | None:
        if self.cfg.loss.beta <= 0:
            return None
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(ro, rows, self.reference)
            with reference_disabled(self.adapter):
                return self._logprobs(ro, rows, self.adapter.model)

    def _chunks(self, n_rows: int) -> list[list[int]]:
        g, steps = self.cfg.data.num_generations, self.cfg.gradient_accumulation_steps
        groups = n_rows // g
        if groups % steps:
            raise ValueError(f"gradient_accumulation_steps={steps} must divide the {groups} prompt groups of a step")
        per = groups // steps
        return [list(range(c * per * g, (c + 1) * per * g)) for c in range(steps)]

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, acc = self.cfg, self.accelerator
        started = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, acc.process_index))
        samples, indices = self._samples(step)
        ro = rollout(self.adapter, samples, cfg.generation, cfg.data.num_generations, acc.device)
        total, components = score(self.rewards, ro.completions, ro.fields)
        advantages, adv_metrics = group_advantages(total, cfg.data.num_generations, cfg.scale_rewards)
        advantages = advantages.to(acc.device)
        mask = ro.completion_mask
        rows = list(range(len(total)))
        chunks = self._chunks(len(rows))
        ref = self._reference_logprobs(ro, rows)
        old = None
        if cfg.num_iterations > 1:
            with torch.no_grad():
                old = self._logprobs(ro, rows, self.model)
        # dapo divides by the tokens of the whole step; DDP averages gradients, so scale by the process count.
        tokens = acc.reduce(mask.sum().float(), reduction="sum") / acc.num_processes
        sums: dict[str, float] = {}
        skipped = 0
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, chunk in enumerate(chunks):
                sync = contextlib.nullcontext() if k == len(chunks) - 1 else acc.no_sync(self.model)
                with sync:
                    logps, logits = self._logprobs(ro, chunk, self.model, with_logits=True)
                    loss, loss_metrics = grpo_loss(
                        logps,
                        None if old is None else old[chunk],
                        None if ref is None else ref[chunk],
                        advantages[chunk],
                        mask[chunk],
                        cfg.loss,
                        normalizer=tokens,
                    )
                    # grpo/dr_grpo normalise per chunk of rows; dapo already divides by the whole step's tokens.
                    weight = 1.0 if cfg.loss.loss_type == "dapo" else len(chunk) / len(rows)
                    acc.backward(loss * weight)
                with torch.no_grad():
                    loss_metrics = {**loss_metrics, "loss": loss.item(), "entropy": entropy_of(logits.detach(), mask[chunk]).item()}
                for key, value in loss_metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(chunk) / len(rows) / cfg.num_iterations
            grad_norm = clip_gradients(self.optimizer, cfg.optim)
            if torch.isfinite(torch.as_tensor(grad_norm)).item():
                self.optimizer.step()
            else:
                skipped += 1
                log.warning("step %d: non-finite gradient norm, update skipped", step)
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        metrics = {
            **sums,
            "reward": total.mean().item(),
            "reward_std": total.std().item() if len(total) > 1 else 0.0,
            **{f"rewards/{name}": v.mean().item() for name, v in components.items()},
            **{k: float(v) for k, v in adv_metrics.items() if k not in ("reward_mean", "reward_std")},
            "completion_length": mask.sum(1).float().mean().item(),
            "grad_norm": float(grad_norm),
            "skipped_updates": skipped,
            **{f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups},
        }
        metrics = self._mean_over_processes(metrics)
        metrics.update(step=step + 1, step_time=time.perf_counter() - started)
        self._log_completions(step + 1, ro, total, components, advantages, indices)
        return metrics

    def _mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.accelerator.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist()))

    def _log_completions(self, step, ro: Rollout, total, components, advantages, indices) -> None:
        if not self.cfg.logging.log_completions:
            return
        g = self.cfg.data.num_generations
        rows = []
        for i, text in enumerate(ro.completions):
            rows.append(
                {
                    "step": step,
                    "process": self.accelerator.process_index,
                    "sample_index": indices[i // g],
                    "prompt": ro.prompt_texts[i // g],
                    "completion": text,
                    "reward": total[i].item(),
                    "rewards": {name: v[i].item() for name, v in components.items()},
                    "advantage": advantages[i].item(),
                }
            )
        gathered = self._gather_rows(rows)
        self.log.completions(gathered)

    def _gather_rows(self, rows: list[dict]) -> list[dict]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)

    # ---------------------------------------------------------------- checkpoints
    def save(self, step: int) -> Path | None:
        self.accelerator.wait_for_everyone()
        path = None
        if self.is_main:
            state = {"config": self.cfg.to_dict(), "num_processes": self.accelerator.num_processes}
            path = ckpt.save_checkpoint(
                self.run_dir, step, self.adapter, self.optimizer, self.scheduler, state, keep=self.cfg.logging.keep_checkpoints
            )
        self.accelerator.wait_for_everyone()
        return path

    def resume(self) -> int:
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            if self.is_main:
                print(f"--resume: no complete checkpoint in {self.run_dir}; starting from step 0")
            return 0
        ckpt.load_weights(self.adapter.model, latest)
        state = ckpt.load_training_state(latest, self.optimizer, self.scheduler)
        self.log.truncate_after(state["step"])
        if self.is_main:
            print(f"resumed from {latest} (step {state['step']})")
        return int(state["step"])

    def save_final(self) -> Path:
        final = self.run_dir / "final"
        self.accelerator.wait_for_everyone()
        if self.is_main:
            tmp = self.run_dir / ".tmp-final"
            shutil.rmtree(tmp, ignore_errors=True)
            ckpt.save_model(self.adapter, tmp)
            if is_lora_wrapped(self.adapter) and self.cfg.logging.save_merged:
                save_merged(self.adapter, tmp / "merged")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        self.accelerator.wait_for_everyone()
        return final

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        start = self.resume() if cfg.resume else 0
        if cfg.logging.report_to:
            flat = {k: str(v) for k, v in _flatten(cfg.to_dict()).items()}
            self.accelerator.init_trackers("vlm-grpo", config=flat)
        history = []
        progress = _progress(start, cfg.max_steps, enabled=self.is_main and cfg.logging.progress)
        for step in range(start, cfg.max_steps):
            metrics = self.train_step(step)
            history.append(metrics)
            self.log.metrics(metrics)
            if cfg.logging.report_to:
                self.accelerator.log(metrics, step=metrics["step"])
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['reward']:.3f}", kl=f"{metrics.get('kl', 0.0):.2e}")
            done = step + 1
            if cfg.logging.save_every and done % cfg.logging.save_every == 0 and done < cfg.max_steps:
                self.save(done)
        progress.close()
        if start < cfg.max_steps or not ckpt.latest_checkpoint(self.run_dir):
            self.save(cfg.max_steps)
        self.save_final()
        if cfg.logging.report_to:
            self.accelerator.end_training()
        return history


def _progress(start: int, total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc="grpo", unit="step", dynamic_ncols=True)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def train(cfg: TrainConfig) -> list[dict[str, Any]]:
    return GRPOTrainer(cfg).train()


