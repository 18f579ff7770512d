"""Where a step's rollout batches come from, one `Draw` at a time in the run's data order (a cursor over the
rollout batches: with dynamic sampling a step may take several):

- `SyncDraws` (rollout.max_staleness 0): sampled now, by the run's sampler, with the weights being trained;
- `AsyncDraws` (max_staleness K > 0): by a worker process with its own copy of the policy
  (rollout/asynchronous/; with rollout.engine vllm in server mode, a thread asking the server), which samples the batches of the next K steps while the trainer trains. A batch
  requested during step t is sampled with the weights of step t (version t: t steps trained). Before each batch
  is taken, K + 1 are kept requested, so what is requested at step t is at most K + 1 places from the front, and
  every step takes at least one: a batch trained on at step t was sampled at version t - K or later (with dynamic
  sampling taking several a step, fewer steps old). The completions come back with their log-probs under the
  weights that sampled them (the engine correction's).

Each draw is sampled from its own seed (the run's seed and the batch's place in the order), so a batch is the same
whichever way it was made. Both travel in the run's checkpoints as they stood after the last completed step
(`commit`): the cursor and, when asynchronous, every batch requested and not yet trained on (waited for, then
saved), so a resumed run trains on what the uninterrupted one would have, and a step that failed draws its batches
again. A generation saved part-way (steps_per_generation > 1: parts/generation_state.py) is `replay`ed: its draws
come back from the checkpoint, as sampled, instead of being sampled again with weights that have moved on."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.grpo.checkpoint.run_state import BadRunState, read_json
from vlm_grpo.grpo.data.order import step_seed
from vlm_grpo.grpo.rollout.asynchronous.worker_handle import RolloutWorker
from vlm_grpo.grpo.rollout.asynchronous.worker_process import Request, Result, WorkerSettings
from vlm_grpo.grpo.rollout.generation import Rollout, encode
from vlm_grpo.grpo.training.policy import generation_fields

QUEUE_FILE = "rollout_queue.safetensors"  # an asynchronous run's requested batches, in its checkpoints
QUEUE_INDEX = "rollout_queue.json"


@dataclass
class Draw:
    index: int  # the rollout batch's place in the run's data order
    version: int  # the weights that sampled it (steps trained before it was requested)
    batch: Any  # the samples and their rows (training_data.Batch)
    sampled: Any  # the sampler's Sampled


class SyncDraws:
    def __init__(self, ctx, data, sampler):
        self.ctx, self.cfg, self.data, self.sampler = ctx, ctx.cfg, data, sampler
        self.cursor = 0  # the next rollout batch
        self.generation_start = 0  # where the current rollout batch's (generation's) draws began
        self.committed = (0, 0)  # (cursor, generation_start) after the last completed step: what checkpoints hold
        self.generation_draws: list[Draw] = []  # the current generation's draws (a checkpoint inside it keeps them)
        self.replaying: deque[Result] = deque()  # a resumed generation's draws, as they were sampled

    def start_generation(self, index: int, resumed_inside: bool = False) -> None:
        """Before a generation's first draw. Without dynamic sampling a generation is one batch, its own index;
        with it, the cursor runs on, and a run resumed inside a generation draws that generation again."""
        if not self.cfg.data.dynamic_sampling:
            self.cursor = index
        elif resumed_inside:
            self.cursor = self.generation_start
        self.generation_start = self.cursor
        self.generation_draws = []

    def replay(self, results: list[Result]) -> None:
        """The next draws are these, as sampled before the run stopped (the generation it resumes inside)."""
        self.replaying = deque(results)

    def begin_step(self, step: int) -> None:
        pass

    def next(self, step: int) -> Draw:
        index = self.cursor
        self.cursor += 1
        first_step = index * self.cfg.steps_per_generation
        if self.replaying:  # no seed: the checkpoint's random state is where the uninterrupted run's stands now
            result = self.replaying.popleft()
            if result.index != index:
                raise RuntimeError(f"the saved generation holds rollout batch {result.index} where batch {index} "
                                   "is next")
            batch = self.data.batch(index)
            sampled = sampled_from(result, batch, self.sampler.adapter, self.sampler.prompt_cache, self.cfg,
                                   self.ctx.device)
            draw = Draw(index, result.version, batch, sampled)
        else:
            torch.manual_seed(step_seed(self.cfg.seed, first_step, self.ctx.accelerator.process_index))
            batch = self.data.batch(index)
            draw = Draw(index, step, batch, self.sampler.sample(batch.samples, batch.rows, first_step))
        self.generation_draws.append(draw)
        return draw

    def metrics(self) -> dict[str, float]:
        return {}

    def commit(self) -> None:
        """The step trained on its draws: a checkpoint from here on starts after them."""
        self.committed = (self.cursor, self.generation_start)

    def close(self) -> None:
        pass

    # ---------------------------------------------------------------- in the run's checkpoints
    def state_dict(self) -> dict[str, Any]:
        cursor, start = self.committed
        return {"rollout_source": {"cursor": cursor, "generation_start": start}}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        if "rollout_source" in state:
            self.cursor = int(state["rollout_source"]["cursor"])
            self.generation_start = int(state["rollout_source"]["generation_start"])
            self.committed = (self.cursor, self.generation_start)

    def save_files(self, directory: Path) -> None:
        pass


class AsyncDraws(SyncDraws):
    def __init__(self, ctx, data, sampler, policy, score_options):
        super().__init__(ctx, data, sampler)
        self.policy, self.score_options = policy, score_options
        self.staleness = ctx.cfg.rollout.max_staleness
        self.issued = 0  # the next rollout batch to request
        self.batches: dict[int, Any] = {}  # requested batch -> its samples (rewards read them when it is trained on)
        self.ready: deque[Result] = deque()  # answers taken from the worker before they were trained on (a save)
        self.uncommitted: list[Result] = []  # answers this step drew (a failed step's go back to the queue's front)
        self.to_save: list[Result] = []  # the queue as the state being saved has it
        self.worker: RolloutWorker | None = None  # started at the first step (after any resume)
        self.taken: list[int] = []  # the staleness of each batch this step drew, for its metrics

    def start_generation(self, index: int, resumed_inside: bool = False) -> None:
        self.generation_start = self.cursor  # one step per generation here (the settings refuse more)

    def begin_step(self, step: int) -> None:
        if self.worker is None:
            self.worker = self._start_worker(step)
        self.taken = []

    def _start_worker(self, version: int):
        """A process with a copy of the policy, or (engine vllm, server mode) a thread asking the server."""
        if not self.cfg.rollout.uses_vllm:
            return RolloutWorker(self.policy.adapter, self._settings(version))
        from vlm_grpo.grpo.rollout.asynchronous.vllm_server import ServerWorker
        from vlm_grpo.grpo.rollout.vllm.modes import open_engine

        engine = open_engine(self.policy.adapter, self.cfg, self.ctx.device, root=self.policy.model,
                             announce=self.ctx.is_main)
        return ServerWorker(engine, self.policy.adapter, self.cfg, self.ctx.device, version)

    def next(self, step: int) -> Draw:
        """The next batch; before it is taken, K + 1 are kept requested (it and K more, at this step's version)."""
        while self.issued < self.cursor + self.staleness + 1:
            self._request(step)
        result = self.ready.popleft() if self.ready else self.worker.take()
        index = self.cursor
        if result.index != index:
            raise RuntimeError(f"rollout batch {result.index} came back where batch {index} was next")
        if step - result.version > self.staleness:  # the loop above keeps this from happening: never train on it
            raise RuntimeError(f"rollout batch {index} was sampled at version {result.version}, "
                               f"{step - result.version} steps old at step {step + 1} (rollout.max_staleness "
                               f"{self.staleness})")
        self.cursor += 1
        self.uncommitted.append(result)
        self.taken.append(step - result.version)
        batch = self.batches.pop(index, None) or self.data.batch(index)  # a resumed queue's batches: looked up again
        return Draw(index, result.version, batch, sampled_from(result, batch, self.policy.adapter,
                                                               self.sampler.prompt_cache, self.cfg, self.ctx.device))

    def metrics(self) -> dict[str, float]:
        """The step's staleness (steps between the weights that sampled its batches and the trained ones; the
        oldest batch's) and the seconds it waited for the worker."""
        waited, self.worker.wait_seconds = self.worker.wait_seconds, 0.0
        metrics = {"async/staleness": float(max(self.taken)), "async/wait_s": waited}
        if self.worker.push_seconds:  # a vLLM server's pushes
            metrics["perf/weight_sync_s"], self.worker.push_seconds = self.worker.push_seconds, 0.0
        return metrics

    def commit(self) -> None:
        super().commit()
        self.uncommitted = []

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def _settings(self, version: int) -> WorkerSettings:
        cfg = self.cfg
        threads = cfg.rollout.worker_threads or torch.get_num_threads()
        return WorkerSettings(generation=cfg.generation, generation_fields=generation_fields(cfg.generation),
                              num_generations=cfg.data.num_generations,
                              shared_prefix=cfg.perf.shared_prefix, score_options=self.score_options,
                              device=str(self.ctx.device), threads=threads, pixel_cache_mb=cfg.perf.pixel_cache_mb,
                              version=version)

    def _request(self, version: int) -> None:
        index = self.issued
        batch = self.data.batch(index)
        self.batches[index] = batch
        self.worker.publish(version, self.policy.adapter.model)
        seed = step_seed(self.cfg.seed, index * self.cfg.steps_per_generation, self.ctx.accelerator.process_index)
        self.worker.request(Request(index, version, seed, batch.samples, batch.rows))
        self.issued += 1

    # ---------------------------------------------------------------- in the run's checkpoints
    def state_dict(self) -> dict[str, Any]:
        """As of the last completed step: its cursor, and the queue from there (a failed step's draws, the
        answers taken, the ones in flight, waited for)."""
        try:
            while self.worker is not None and self.worker.in_flight:
                self.ready.append(self.worker.take())
        except Exception:  # noqa: BLE001 - a failed worker: what it did not answer is requested again on resume
            self.worker.in_flight.clear()
            self.issued = self.cursor + len(self.ready)
        self.to_save = [*self.uncommitted, *self.ready]
        cursor, start = self.committed
        return {"rollout_source": {"cursor": cursor, "generation_start": start, "issued": cursor + len(self.to_save)}}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        super().load_state_dict(state, checkpoint)
        if "rollout_source" not in state:
            return
        self.issued = int(state["rollout_source"].get("issued", self.cursor))
        self.ready = deque(_read_queue(checkpoint))
        if [r.index for r in self.ready] != list(range(self.cursor, self.issued)):
            raise ValueError(f"{checkpoint}: its rollout queue holds batches {[r.index for r in self.ready]}, "
                             f"not {self.cursor}..{self.issued - 1} as its state says")

    def save_files(self, directory: Path) -> None:
        """Every batch requested and not trained on by a completed step (state_dict gathered them)."""
        _write_queue(directory, self.to_save)


def sampled_from(result: Result, batch, adapter, prompt_cache, cfg, device):
    """A rollout batch sampled elsewhere or earlier (a worker's answer, a saved generation) as the sampler's Sampled,
    its prompts encoded here for the trainer's forwards, and checked token for token against the ones it was
    sampled for."""
    from vlm_grpo.grpo.parts.sampler import Sampled

    if list(result.rows) != list(batch.rows):
        raise RuntimeError(f"rollout batch {result.index} was sampled for rows {result.rows}, and the run's "
                           f"order gives rows {batch.rows}")
    prompts = encode(adapter, batch.samples, device, cache=prompt_cache)
    ids = prompts.input_ids.to("cpu")
    if ids.shape != result.prompt_ids.shape or not torch.equal(ids, result.prompt_ids):
        rows = range(min(ids.shape[0], result.prompt_ids.shape[0]))
        bad = next((k for k in rows if not torch.equal(ids[k], result.prompt_ids[k])), 0)
        raise ImageTokenMismatch(f"sample {result.rows[bad]} (rollout batch {result.index}): the trainer "
                                 "encoded its prompt to other tokens than it was sampled for; its "
                                 "completions would be scored against another prompt")
    logps = result.sampling_logps
    ro = Rollout(prompts=prompts, completion_ids=result.completion_ids.to(device),
                 completion_mask=result.completion_mask.to(device), truncated=result.truncated.to(device),
                 completions=result.completions, prompt_texts=result.prompt_texts,
                 num_generations=cfg.data.num_generations, stats=dict(result.stats),
                 sampling_logps=None if logps is None else logps.to(device))
    return Sampled(ro, None, None)


def result_of(draw: Draw) -> Result:
    """A draw as plain tensors and text (to keep in a checkpoint)."""
    ro = draw.sampled.rollout
    logps = ro.sampling_logps
    return Result(index=draw.index, version=draw.version, rows=list(draw.batch.rows),
                  prompt_ids=ro.prompts.input_ids.detach().cpu(), completion_ids=ro.completion_ids.detach().cpu(),
                  completion_mask=ro.completion_mask.detach().cpu(), truncated=ro.truncated.detach().cpu(),
                  completions=list(ro.completions), prompt_texts=list(ro.prompt_texts),
                  sampling_logps=None if logps is None else logps.detach().cpu(), stats=dict(ro.stats))


_TENSORS = ("prompt_ids", "completion_ids", "completion_mask", "truncated", "sampling_logps")


def _write_queue(directory: Path, results: list[Result]) -> None:
    write_results(directory, results, QUEUE_FILE, QUEUE_INDEX)


def write_results(directory: Path, results: list[Result], tensor_file: str, index_file: str,
                  more: dict[str, torch.Tensor] | None = None, facts: dict[str, Any] | None = None) -> None:
    """Rollout batches as one safetensors file (plus `more` tensors) and a JSON index (plus `facts`)."""
    tensors = {f"{k}.{name}": getattr(r, name).contiguous() for k, r in enumerate(results) for name in _TENSORS
               if getattr(r, name) is not None}
    tensors.update({f"more.{name}": t.detach().cpu().contiguous() for name, t in (more or {}).items()})
    index = [{"index": r.index, "version": r.version, "rows": r.rows, "completions": r.completions,
              "prompt_texts": r.prompt_texts, "stats": r.stats} for r in results]
    save_file(tensors, str(directory / tensor_file))
    (directory / index_file).write_text(json.dumps(index if facts is None else {"batches": index, **facts}))


def _read_queue(checkpoint: Path) -> list[Result]:
    if not (checkpoint / QUEUE_INDEX).is_file():
        return []
    results, _, _ = read_results(checkpoint, QUEUE_FILE, QUEUE_INDEX)
    return results


def read_results(checkpoint: Path, tensor_file: str, index_file: str) -> tuple[list[Result], dict[str, torch.Tensor], dict]:
    """(batches, `more` tensors, facts) of `write_results`, read as plain data and checked against their tensors
    (the manifest verified the files)."""
    path = checkpoint / index_file
    index = read_json(path)
    tensors = load_file(str(checkpoint / tensor_file))
    facts: dict = {}
    if isinstance(index, dict):
        facts = {k: v for k, v in index.items() if k != "batches"}
        index = index.get("batches")
    if not isinstance(index, list):
        raise BadRunState(path, "(the file)", f"must hold a list of rollout batches, got {type(index).__name__}")
    results = []
    for k, e in enumerate(index):
        try:
            results.append(Result(
                index=int(e["index"]), version=int(e["version"]), rows=[int(r) for r in e["rows"]],
                completions=[str(t) for t in e["completions"]], prompt_texts=[str(t) for t in e["prompt_texts"]],
                stats={str(n): int(v) for n, v in e["stats"].items()},
                **{name: tensors.get(f"{k}.{name}") for name in _TENSORS}))
            if any(getattr(results[-1], name) is None for name in _TENSORS[:4]):
                raise KeyError("a tensor of the batch")
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BadRunState(path, f"entry {k}", f"is not a saved rollout batch ({type(err).__name__}: {err})") \
                from None
    more = {name[len("more."):]: t for name, t in tensors.items() if name.startswith("more.")}
    return results, more, facts
