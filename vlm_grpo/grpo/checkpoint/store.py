"""Checkpoints written atomically (temp dir + rename), so a kill never leaves a half one to resume from.

A checkpoint holds the weights (or LoRA adapter) as safetensors, the processor, optimizer, scheduler and RNG
states, the step and log history (trainer_state.json, transformers' TrainerState), the config (run_state.json),
and last a manifest of every file's size and sha256 (grpo/checkpoint/manifest.py). Only directories named
`checkpoint-N` that contain `trainer_state.json` count; the rename is the commit point. Resuming verifies the newest one against its manifest and
falls back to the newest one that verifies, saying which file of which checkpoint was bad. The optimizer,
scheduler and RNG files hold only tensors and plain values and are read without unpickling anything else
(grpo/safe_loading.py): a checkpoint from someone else cannot run code on resume.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from vlm_grpo import resource_limits
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.checkpoint.manifest import verify, write_manifest
from vlm_grpo.grpo.checkpoint.run_state import check_run_state, check_trainer_state, read_json
from vlm_grpo.grpo.safe_files import CreatedFiles, DiskFull
from vlm_grpo.grpo.safe_loading import UnsafeCheckpointFile, load_state_file  # noqa: F401 - resume catches it as ckpt.UnsafeCheckpointFile

STATE_FILE = "trainer_state.json"  # transformers' TrainerState; its presence marks a complete checkpoint
RUN_STATE_FILE = "run_state.json"  # the run's own: step, config, stage, process count, fsdp


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_model(adapter, out_dir: Path) -> None:
    adapter.model.save_pretrained(out_dir, safe_serialization=True)
    adapter.processor.save_pretrained(out_dir)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, adapter, optimizer, scheduler, state: dict[str, Any], keep: int = 2,
                    extra=None) -> Path:
    """`extra(directory)`: writes the stage's own files into the checkpoint before it is committed. Disk full while
    saving removes the unfinished copy and raises DiskFull (the path, the space needed): the previous checkpoint
    stays as it was."""
    tmp = staging_dir(run_dir, f".tmp-checkpoint-{step}-{os.getpid()}")
    with resource_errors_say(tmp, run_dir, need=lambda: checkpoint_bytes(adapter)):
        save_model(adapter, tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if extra is not None:
            extra(tmp)
    return commit_checkpoint(tmp, run_dir, step, scheduler, state, keep, need=lambda: checkpoint_bytes(adapter))


def staging_dir(run_dir: Path, name: str) -> Path:
    """A fresh folder in `run_dir` a save writes into before its rename, recorded first (a kill leaves it listed, so
    the next start removes it)."""
    listed = CreatedFiles(run_dir)
    listed.add(name)
    path = safe_files.fresh_dir(Path(run_dir) / name)
    listed.record(name)
    return path


def checkpoint_bytes(adapter) -> int:
    """About what a checkpoint takes: the weights, plus Adam's two float32 moments of every trainable parameter."""
    params = list(adapter.model.parameters())
    return sum(p.numel() * p.element_size() for p in params) + sum(p.numel() * 8 for p in params if p.requires_grad)


@contextlib.contextmanager
def resource_errors_say(tmp: Path, run_dir: Path, need=lambda: None):
    """A resource running out inside (a full disk or quota, `ulimit -f`, `ulimit -n`, memory): the unfinished `tmp`
    removed, and one line naming the resource, its limit and the file (a full disk: DiskFull with the space needed
    and free); the previous checkpoint stays as it was. Any other failure passes through as it is."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - torch's and safetensors' writers report a full disk in their own words
        found = resource_limits.cause(err, written=tmp)
        if found is None:
            raise
        code = found[1]
        path = resource_limits.oversized_file(tmp) if code == errno.EFBIG else None
        path = path or getattr(found[0], "filename", None) or tmp
        _discard_staging(tmp, run_dir)
        kept = "the previous checkpoint is kept as it was"
        if code == errno.ENOSPC:
            needed, free = resource_limits.size_pair(need() or 0, shutil.disk_usage(run_dir).free)
            raise DiskFull(errno.ENOSPC, f"disk full while saving {tmp} in {run_dir}: a checkpoint needs about "
                           f"{needed}, {free} are free; {kept}. Free some space (or lower logging.keep_checkpoints) "
                           "and --resume", tmp) from None
        latest = latest_checkpoint(run_dir)
        line = resource_limits.line_for(err, found, path, then="--resume" if latest else "run again", kept=f"{kept} "
                                        f"({latest.name})" if latest else "no checkpoint was saved before this one")
        raise resource_limits.ResourceLimitReached(code, line, path) from None


def _discard_staging(tmp: Path, run_dir: Path) -> None:
    """The unfinished copy gone and unlisted; when even that fails (no file descriptor left), it stays listed, and the
    next start removes it."""
    try:
        safe_files.remove(tmp)
        CreatedFiles(run_dir).discard(tmp.name)
    except OSError:
        pass


def commit_checkpoint(tmp: Path, run_dir: Path, step: int, scheduler, state: dict[str, Any], keep: int = 2,
                      need=lambda: None) -> Path:
    """`tmp` (weights and optimizer state already in it) plus scheduler, RNG state, step and manifest, renamed to
    checkpoint-`step`: the rename is the commit point."""
    final = run_dir / f"checkpoint-{step}"
    with resource_errors_say(tmp, run_dir, need):
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng_state.pt")
        write_states(tmp, step, state)
        write_manifest(tmp)
        _fsync_dir(tmp)
    safe_files.check_path(final)
    listed = CreatedFiles(run_dir)
    listed.add(final.name)  # refused when the folder there is not the one this run wrote
    if final.exists():  # re-saving a step (e.g. the end of a resumed run): replace it whole
        old = run_dir / f".old-checkpoint-{step}-{os.getpid()}"
        listed.add(old.name)
        final.rename(old)
        listed.record(old.name)
        tmp.rename(final)
        listed.record(final.name)
        safe_files.remove(old)
        listed.discard(old.name, tmp.name)
    else:
        tmp.rename(final)
        listed.record(final.name)
        listed.discard(tmp.name)
    listed.settle()  # folders made meanwhile (a tracker's) recorded as the run's
    _fsync_dir(run_dir, recursive=False)
    _rotate(run_dir, keep)
    return final


def write_states(folder: Path, step: int, state: dict[str, Any]) -> None:
    """trainer_state.json as transformers writes it (`TrainerState`: global_step, max_steps, log_history ...), so
    `TrainerState.load_from_json` and tools made for the Trainer read it; the run's own state (config, stage,
    process count, fsdp) in run_state.json."""
    from transformers import TrainerState

    run_state = {k: v for k, v in state.items() if k != "log_history"}
    config = run_state.get("config", {})
    TrainerState(
        global_step=step, max_steps=config.get("max_steps", step),
        save_steps=config.get("logging", {}).get("save_every", 0),
        train_batch_size=config.get("data", {}).get("batch_size"),
        log_history=[dict(m) for m in state.get("log_history", ()) if m.get("step", 0) <= step],
    ).save_to_json(str(folder / STATE_FILE))
    safe_files.write_file(folder / RUN_STATE_FILE, json.dumps({"step": step, **run_state}, indent=2, default=str))


def _fsync_dir(path: Path, recursive: bool = True) -> None:
    for file in path.rglob("*") if recursive else path.iterdir():
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in Path(run_dir).glob("checkpoint-*"):
        suffix = path.name.split("-", 1)[1]
        if suffix.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(suffix), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


class NoGoodCheckpoint(RuntimeError):
    """Every checkpoint of a run failed verification."""


def latest_good_checkpoint(run_dir: Path, report=print) -> Path | None:
    """The newest checkpoint that verifies against its manifest; each bad one passed over is reported (which file,
    what is wrong). None when the run has no checkpoint; NoGoodCheckpoint when none verifies."""
    found = complete_checkpoints(run_dir)
    for _, path in reversed(found):
        problems = verify(path)
        if not problems:
            return path
        report(f"{path.name} is damaged, not resuming from it: {'; '.join(problems)}")
    if found:
        raise NoGoodCheckpoint(f"no checkpoint in {run_dir} verifies against its manifest (see above); "
                               "start again without --resume or restore the files")
    return None


def _rotate(run_dir: Path, keep: int) -> None:
    """Older checkpoints beyond `keep` removed: only those this run created."""
    if keep <= 0:
        return
    created = CreatedFiles(run_dir)
    mine = created.names()
    gone = [path.name for _, path in complete_checkpoints(run_dir)[:-keep] if path.name in mine]
    for name in gone:
        safe_files.remove(run_dir / name)
    created.discard(*gone)


def load_weights(model, checkpoint: Path) -> None:
    """Weights of `checkpoint` into `model` in place (full model or LoRA adapter)."""
    from safetensors.torch import load_file

    if _is_peft(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(checkpoint / "adapter_model.safetensors"))
        return
    # from_pretrained applies the library's own key conversions (saved names differ from module names
    # in transformers 5), so the checkpoint is read exactly as users will read it.
    dtype = next(model.parameters()).dtype
    saved = type(model).from_pretrained(checkpoint, dtype=dtype, use_safetensors=True)  # never a pickled .bin
    model.load_state_dict(saved.state_dict(), strict=True)


def load_training_state(checkpoint: Path, optimizer, scheduler, trust: bool = False) -> dict[str, Any]:
    """Optimizer (None: read elsewhere, e.g. from the shards), scheduler, RNG state and the saved step. Every file is
    read, as plain data (unless `trust`), before any of them is applied."""
    names = (["optimizer.pt"] if optimizer is not None else []) + ["scheduler.pt", "rng_state.pt"]
    read = {name: load_state_file(checkpoint / name, trust=trust) for name in names}
    if optimizer is not None:
        optimizer.load_state_dict(read["optimizer.pt"])
    scheduler.load_state_dict(read["scheduler.pt"])
    set_rng_state(read["rng_state.pt"])
    return read_states(checkpoint)


def read_states(checkpoint: Path) -> dict[str, Any]:
    """The run state of a checkpoint, with the step and the log history its trainer_state.json holds."""
    from transformers import TrainerState

    trainer_file, run_file = checkpoint / STATE_FILE, checkpoint / RUN_STATE_FILE
    for path in (trainer_file, run_file):
        safe_files.check_path(path)
    saved = read_json(trainer_file)
    if isinstance(saved, dict) and "global_step" not in saved:  # written before trainer_state.json became
        return check_run_state({k: v for k, v in saved.items() if k != "log_history"}, trainer_file) | (
            {"log_history": check_trainer_state({"global_step": 0, "log_history": saved["log_history"]},
                                                trainer_file)["log_history"]} if "log_history" in saved else {})
    check_trainer_state(saved, trainer_file)
    trainer_state = TrainerState.load_from_json(str(trainer_file))
    run_state = check_run_state(read_json(run_file), run_file, required=()) if run_file.is_file() else {}
    return {**run_state, "step": trainer_state.global_step, "log_history": trainer_state.log_history}
