"""The rollout worker process: its own copy of the policy (sent once, at start), which samples each request with
the weights version the request names (sent before it, on the same queue) and answers with the completions and
their log-probs under those weights (the behaviour policy's, for the trainer's importance-sampling correction):
taken as each token is drawn (from the decode step's logits, as vLLM returns its own), or, where generate()'s own
sampler draws, by a forward as the trainer's.

Requests are answered in the order they come, one at a time, each from the seed it carries: the same request
gives the same completions however far ahead of the trainer it ran. The worker ignores SIGINT and SIGTERM (the
trainer finishes its step and saves, which needs the answers in flight) and exits when told to, or when the
trainer's process is gone."""

from __future__ import annotations

import os
import pickle
import queue
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from vlm_grpo.adapters.prompt_cache import PromptCache
from vlm_grpo.adapters.sampler import TokenLogps
from vlm_grpo.compat.picklable_model import registered_again
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores
from vlm_grpo.grpo.rollout.generation import encode, rollout

PARENT_CHECK_S = 5.0  # how often an idle worker checks that its trainer is still there


@dataclass
class WorkerSettings:
    """What the worker needs besides the policy: how to sample and score, where, with how many threads."""

    generation: Any  # the run's GenerationConfig
    generation_fields: dict[str, Any]  # set on the copy's generation config (it only ever samples)
    num_generations: int
    shared_prefix: bool
    score_options: ScoreOptions  # as the trainer's log-prob forwards take them (share_features, temperature, ...)
    device: str
    threads: int
    pixel_cache_mb: int
    version: int  # the version of the weights it is sent with


@dataclass
class Weights:
    """The trainable weights at `version` (name -> CPU tensor), sent before the first request that names it."""

    version: int
    tensors: dict[str, torch.Tensor]


@dataclass
class Request:
    index: int  # the rollout batch (its place in the run's data order)
    version: int  # the weights that sample it
    seed: int
    samples: list
    rows: list[int]


@dataclass
class Result:
    index: int
    version: int
    rows: list[int]
    prompt_ids: torch.Tensor  # [B, L] as the worker encoded them (the trainer checks its own encoding against them)
    completion_ids: torch.Tensor  # [B*G, T]
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    completions: list[str]
    prompt_texts: list[str]
    sampling_logps: torch.Tensor  # [B*G, T] under the weights at `version`
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class Failure:
    index: int
    error: BaseException | None  # the exception itself where it pickles
    text: str  # its traceback as the worker printed it


def serve(adapter, settings: WorkerSettings, requests, results) -> None:
    """The worker's loop (the spawned process's target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    torch.set_num_threads(settings.threads)
    model = registered_again(adapter.model).to(settings.device)
    for key, value in settings.generation_fields.items():
        setattr(model.generation_config, key, value)
    params = dict(model.named_parameters())
    cache = PromptCache.of_mib(settings.pixel_cache_mb)
    pending: dict[int, dict[str, torch.Tensor]] = {}
    version = settings.version
    while True:
        try:
            message = requests.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer died without closing us
                return
            continue
        if message is None:
            return
        if isinstance(message, Weights):
            pending[message.version] = message.tensors
            continue
        try:
            if message.version != version:
                _load(params, pending.pop(message.version))
                version = message.version
                for old in [v for v in pending if v < version]:
                    del pending[old]
            answer = _sample(adapter, message, settings, cache)
        except BaseException as err:  # the trainer raises it, naming the batch
            answer = Failure(message.index, _picklable(err), traceback.format_exc())
        # pickled here, by value: the queue's own pickler would share the tensors' memory through this process,
        # and an answer the trainer reads after this process has gone would be lost
        results.put(pickle.dumps(answer))


def _load(params: dict[str, torch.nn.Parameter], tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


def _sample(adapter, request: Request, settings: WorkerSettings, cache: PromptCache) -> Result:
    """The same calls the trainer's own rollout makes (rollout/generation.py), then the log-probs of what was
    sampled under the weights that sampled it, as the trainer's forwards compute them."""
    device, g = torch.device(settings.device), settings.num_generations
    torch.manual_seed(request.seed)
    prompts = encode(adapter, request.samples, device, cache=cache)
    drawn = TokenLogps(settings.generation.temperature)
    ro = rollout(adapter, request.samples, settings.generation, g, device, shared_prefix=settings.shared_prefix,
                 prompts=prompts, token_logps=drawn)
    logps = drawn.tensor()
    if logps is None or logps.shape != ro.completion_ids.shape:  # not drawn by the inverse-CDF sampler: a forward
        rows = list(range(ro.completion_ids.shape[0]))
        with torch.no_grad():
            logps = group_scores(adapter, prompts, ro.prompt_index(rows), ro.completion_ids, ro.completion_mask,
                                 adapter.model, settings.score_options).logps
    cpu = torch.device("cpu")
    return Result(index=request.index, version=request.version, rows=request.rows,
                  prompt_ids=prompts.input_ids.to(cpu), completion_ids=ro.completion_ids.to(cpu),
                  completion_mask=ro.completion_mask.to(cpu), truncated=ro.truncated.to(cpu),
                  completions=ro.completions, prompt_texts=ro.prompt_texts, sampling_logps=logps.float().to(cpu),
                  stats=dict(ro.stats))


def _picklable(err: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return None
