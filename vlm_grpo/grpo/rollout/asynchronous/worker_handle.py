"""The trainer's handle on its rollout worker (worker_process.py): starts it with a copy of the policy, sends it each
weights version before the first request that needs it, sends requests and takes their answers in order."""

from __future__ import annotations

import contextlib
import copy
import pickle
import queue
import sys
import time
from collections import deque

import torch

from vlm_grpo.compat.picklable_model import without_hooks
from vlm_grpo.grpo.rollout.asynchronous.worker_process import Failure, Request, Result, Weights, WorkerSettings, serve

JOIN_TIMEOUT_S = 30.0
PRELOAD = ["torch", "transformers", "vlm_grpo.grpo.rollout.asynchronous.worker_process"]  # imported once, by the server


class WorkerFailed(RuntimeError):
    """The worker could not sample a batch, or exited: names the batch and the worker's error."""


class RolloutWorker:
    def __init__(self, adapter, settings: WorkerSettings):
        """Starts the worker process with a CPU copy of `adapter` (the policy at `settings.version`). Not forked from
        this process (a forked child of a process whose torch threads have run can hang in its first parallel
        region): forked from a fresh server process that has imported torch, transformers and the worker and run
        nothing (multiprocessing's forkserver, one per trainer process), so a worker starts in about a second
        instead of importing them again."""
        context = torch.multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        self.requests, self.results = context.Queue(), context.Queue()
        sent = copy.deepcopy(adapter)
        without_hooks(sent.model.to("cpu"))  # the trainer's hooks stay its own (compat/picklable_model.py)
        self.process = context.Process(target=serve, args=(sent, settings, self.requests, self.results),
                                       name="vlm-grpo-rollout-worker", daemon=True)
        try:
            with _main_not_imported():
                self.process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise WorkerFailed(f"the policy cannot be sent to the rollout worker process (rollout.max_staleness): "
                               f"{type(err).__name__}: {err}. Its model and processor must pickle (no functions "
                               "made inside other functions set on them)") from None
        del sent
        self.version = settings.version  # the newest version sent
        self.in_flight: deque[Request] = deque()
        self.wait_seconds = 0.0  # time the trainer spent waiting for answers (since the last read)
        self.push_seconds = 0.0  # sending weights costs a queue put here (the server's worker pushes: vllm_server.py)

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """The trainable weights of `model` as version `version` (what is frozen never changes, so never goes)."""
        if version == self.version:
            return
        tensors = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}
        self.requests.put(Weights(version, tensors))
        self.version = version

    def request(self, request: Request) -> None:
        if request.version != self.version:
            raise ValueError(f"request for version {request.version} while version {self.version} was sent last")
        self.requests.put(request)
        self.in_flight.append(request)

    def take(self) -> Result:
        """The oldest request's answer (waiting for it)."""
        request = self.in_flight.popleft()
        started = time.perf_counter()
        answer = self._answer(request)
        self.wait_seconds += time.perf_counter() - started
        if isinstance(answer, Failure):
            message = f"the rollout worker failed sampling rollout batch {request.index} (rows {request.rows})"
            if answer.error is not None:  # the error itself (a bad row's message names its row), then where it was
                raise answer.error from WorkerFailed(f"{message}:\n{answer.text}")
            raise WorkerFailed(f"{message}:\n{answer.text}")
        if answer.index != request.index:  # answers come in order: anything else is a broken worker
            raise WorkerFailed(f"the rollout worker answered batch {answer.index} where {request.index} was next")
        return answer

    def _answer(self, request: Request):
        while True:
            try:
                return pickle.loads(self.results.get(timeout=1.0))
            except queue.Empty:
                if not self.process.is_alive():
                    raise WorkerFailed(f"the rollout worker exited (code {self.process.exitcode}) before answering "
                                       f"rollout batch {request.index}") from None

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(JOIN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(JOIN_TIMEOUT_S)
        # what is still queued for a worker that has gone will never be read: the queue's feeder thread must not
        # hold this process open writing it
        self.requests.cancel_join_thread()
        self.requests.close()
        self.results.close()


@contextlib.contextmanager
def _main_not_imported():
    """A spawned child imports the parent's __main__ again before it runs: a training script without an
    `if __name__ == "__main__"` guard would start a second run there. Hidden while the child is started: the worker
    needs nothing from it (the policy it gets is pickled by reference to its classes' own modules)."""
    main = sys.modules.get("__main__")
    spec, path = getattr(main, "__spec__", None), getattr(main, "__file__", None)
    main.__spec__ = None  # multiprocessing reads it, then __file__, to decide what to import
    if path is not None:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if path is not None:
            main.__file__ = path
