"""Asynchronous rollouts through a `vlm-grpo vllm-serve` server (rollout.engine vllm, vllm_mode server): the same
handle as the worker process's (worker_handle.py) over a thread that sends each request to the server while the
trainer trains. The server holds one set of weights, so a new version is pushed (by the trainer's thread, which owns
the weights) only once the batches of older versions are answered; with max_staleness 1 that costs no overlap."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from vlm_grpo.grpo.rollout.asynchronous.worker_process import Request, Result
from vlm_grpo.grpo.rollout.generation import encode
from vlm_grpo.grpo.rollout.vllm.requests import requests, sampling_options, to_rollout


class ServerWorker:
    def __init__(self, engine, adapter, cfg, device, version: int):
        """`engine`: the run's ServerEngine, holding the policy at `version` (open_engine pushed it)."""
        self.engine, self.adapter, self.cfg, self.device = engine, adapter, cfg, device
        self.version = version
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlm-grpo-vllm-rollouts")
        self.in_flight: deque[Future] = deque()
        self.wait_seconds = 0.0
        self.push_seconds = 0.0  # spent pushing weights since the last read

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Version `version` into the server, once every batch of an older one is answered."""
        if version == self.version:
            return
        started = time.perf_counter()
        for future in self.in_flight:
            future.exception()  # waits; an error stays in the future, raised when its batch is taken
        self.wait_seconds += time.perf_counter() - started
        pushed = time.perf_counter()
        self.engine.push()
        self.push_seconds += time.perf_counter() - pushed
        self.version = version

    def request(self, request: Request) -> None:
        self.in_flight.append(self.thread.submit(self._sample, request))

    def take(self) -> Result:
        future = self.in_flight.popleft()
        started = time.perf_counter()
        try:
            return future.result()
        finally:
            self.wait_seconds += time.perf_counter() - started

    def _sample(self, request: Request) -> Result:
        """As the synchronous vLLM rollout samples (its seed drawn from the request's as that one draws it)."""
        g, gen = self.cfg.data.num_generations, self.cfg.generation
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(request.seed)))
        prompts = encode(self.adapter, request.samples, self.device)
        results = self.engine.generate(requests(self.adapter, request.samples),
                                       sampling_options(self.adapter, gen, g, seed))
        ro = to_rollout(self.adapter, prompts, request.samples, results, g, self.device)
        cpu = torch.device("cpu")
        return Result(index=request.index, version=request.version, rows=request.rows,
                      prompt_ids=prompts.input_ids.to(cpu), completion_ids=ro.completion_ids.to(cpu),
                      completion_mask=ro.completion_mask.to(cpu), truncated=ro.truncated.to(cpu),
                      completions=ro.completions, prompt_texts=ro.prompt_texts,
                      sampling_logps=ro.sampling_logps.float().to(cpu), stats=dict(ro.stats))

    def close(self) -> None:
        self.thread.shutdown(wait=True, cancel_futures=True)
        self.engine.close()
