"""GRPO's rollout: B prompts encoded once and G sampled completions each, through the run's engine (transformers'
generate(), vLLM, a user's rollout_func, or multi-turn tool calls); with encode-once, the policy's own image
features (with gradient) taken first, which the rollout samples from (detached) and the single update reuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vlm_grpo.adapters.prompt_cache import PromptCache
from vlm_grpo.adapters.sharing import image_features
from vlm_grpo.grpo.rollout.custom import custom_rollout
from vlm_grpo.grpo.rollout.generation import Rollout, encode, rollout
from vlm_grpo.grpo.rollout.turns import ToolRollout
from vlm_grpo.grpo.training.policy import sampling_with


@dataclass
class Sampled:
    rollout: Rollout
    policy_features: Any  # the policy's image features with gradient (encode-once), else None
    session: Any  # the step's tool session (environments, tools per rollout), None without tools


class Sampler:
    def __init__(self, ctx, policy, scorer, toolset, chat_format, rollout_func: Callable | None = None,
                 owner: Any = None):
        """`rollout_func`: TRL's, called as rollout_func(prompts, owner) (rollout/custom.py)."""
        self.ctx, self.cfg, self.policy, self.adapter = ctx, ctx.cfg, policy, policy.adapter
        self.scorer = scorer  # says whether the step encodes the images once
        self.toolset, self.chat_format = toolset, chat_format
        self.rollout_func, self.owner = rollout_func, owner
        self.engine = None  # rollout.engine vllm: opened at the first rollout (after any resume), rollout/vllm/engine.py
        self.prompt_cache = PromptCache.of_mib(self.cfg.perf.pixel_cache_mb)  # rows seen again skip the processor

    def sample(self, samples: list, rows: list[int], step: int) -> Sampled:
        cfg, g, device = self.cfg, self.cfg.data.num_generations, self.ctx.device
        session = self.toolset.start(samples, g, rows=rows, step=step + 1).format(self.chat_format) \
            if self.toolset.enabled else None
        policy = self.policy
        with self.ctx.accelerator.autocast(), sampling_with(self.adapter.model, cfg.generation):  # policy's precision
            prompts = encode(self.adapter, samples, device, session, cache=self.prompt_cache)
            policy_features = image_features(self.adapter, prompts, model=policy.model) \
                if self.scorer.encodes_once() else None
            sampled_from = None if policy_features is None else policy_features.detach()
            if self.rollout_func is not None:  # the user's rollout, whichever engine the run names (TRL's rule)
                ro = custom_rollout(self.rollout_func, self.owner, self.adapter, samples, prompts, g)
                return Sampled(ro, policy_features, session)
            if cfg.rollout.uses_vllm:  # vLLM samples; the trainer encoded the prompts for its own forwards
                # tool images are encoded by the policy (once each, as below); vLLM holds its own weights, so
                # the policy's stay sharded
                ro = self.open_engine().rollout(
                    samples, prompts, cfg.generation, g, device, session, self.chat_format,
                    max_iterations=cfg.tools.max_tool_calling_iterations,
                    encoder=policy.model if policy_features is not None else None)
                return Sampled(ro, policy_features, session)
            args, turns = (self.adapter, samples, cfg.generation, g, device), cfg.tools.max_tool_calling_iterations
            ro = policy.with_full_weights(lambda: rollout(
                *args, shared_prefix=cfg.perf.shared_prefix, prompts=prompts, features=sampled_from,
            ) if session is None else ToolRollout.sample(  # multi-turn: tool images encoded once each
                *args, session, self.chat_format, prompts, features=sampled_from, max_iterations=turns,
                shared_prefix=cfg.perf.shared_prefix, encoder=policy.model if policy_features is not None else None))
        return Sampled(ro, policy_features, session)

    def open_engine(self):
        if self.engine is None:
            from vlm_grpo.grpo.rollout.vllm.modes import open_engine

            # every process opens its engine (colocate) or its client (server) at the same rollout; a sharded
            # policy's first push gathers unit by unit across them
            self.engine = open_engine(self.adapter, self.cfg, self.ctx.device, root=self.policy.model,
                                      announce=self.ctx.is_main)
        return self.engine

    def after_update(self) -> dict[str, float]:
        """The new weights to vLLM every vllm_sync_steps steps (no engine: nothing to do); the push's time when one
        was made."""
        if self.engine is None:
            return {}
        pushes = self.engine.pushes
        self.engine.after_update()
        return {"perf/weight_sync_s": self.engine.push_seconds[-1]} if self.engine.pushes > pushes else {}
