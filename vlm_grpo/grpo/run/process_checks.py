"""What the processes of a run, on one machine or several, must agree on.

- The run directory is one directory for every process (`check_shared_run_dir`): the main process writes the
  logs, completions, checkpoints and card, but every process reads the checkpoint it resumes from, and under FSDP
  every process writes its own shard into the checkpoint. A run whose machines each see their own
  `output_dir` would save checkpoints nobody can resume, so it is refused at the start, before a model loads:
  the main process writes a file with a fresh random token, and every process must read that token back.
  Network filesystems (NFS) can show another machine's new file late, so each process polls for it for up to
  `logging.shared_dir_timeout` seconds; on a shared directory it is there at once.
- A checkpoint is resumed by as many processes as wrote it (`check_same_process_count`): a process's prompts and
  sampling seeds are functions of (seed, step, global rank, process count) (grpo/data/order.py), and FSDP's shard
  files are one per rank, so another count would not continue the same run.
"""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vlm_grpo.grpo.distributed.processes import on_main
from vlm_grpo.grpo.checkpoint.store import read_states
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.setting_fields import SettingError

MARKER_PREFIX = ".shared-dir-check-"


def _reads_back(path: Path, token: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if path.read_text() == token:
                return True
        except OSError:  # not there (yet): a directory this machine does not share, or a filesystem that lags
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _write_marker(run_dir: Path) -> tuple[str, str]:
    for stale in run_dir.glob(MARKER_PREFIX + "*"):  # left by a run killed during its own check
        stale.unlink(missing_ok=True)
    token = secrets.token_hex(16)
    marker = run_dir / f"{MARKER_PREFIX}{token[:8]}"
    safe_files.write_file(marker, token)
    return marker.name, token


def check_shared_run_dir(run_dir: Path, accelerator, timeout: float) -> None:
    """Refuse (on every process, in one line) a run directory that some process does not share with the main one.
    Call it after the main process created the directory; every process must call it."""
    if accelerator.num_processes == 1:
        return
    name, token = on_main(accelerator, lambda: _write_marker(Path(run_dir)))
    marker = Path(run_dir) / name  # in this process's own output_dir: the one it would write to
    seen = _reads_back(marker, token, timeout)
    views: list[Any] = [None] * accelerator.num_processes
    dist.all_gather_object(views, (accelerator.process_index, socket.gethostname(), seen))
    if accelerator.is_main_process:
        marker.unlink(missing_ok=True)
    blind = [f"{rank} (on {host})" for rank, host, ok in views if not ok]
    if blind:
        raise SettingError("logging.output_dir", f"{run_dir} is not one directory for every process: process"
                           f"{'es' if len(blind) > 1 else ''} {', '.join(blind)} did not see the file the main process "
                           f"(on {views[0][1]}) wrote there within {timeout:g} s; put the run directory on a filesystem "
                           "every machine mounts at the same path (NFS, Lustre, ...), or raise logging.shared_dir_timeout "
                           "if it is shared but slow to show new files")


def check_same_process_count(checkpoint: Path, processes: int) -> None:
    """Refuse to resume `checkpoint` with a process count other than the one that wrote it."""
    state = read_states(Path(checkpoint))
    written, mode = state.get("num_processes"), state.get("fsdp", "no")
    if written is not None and int(written) != processes:
        under = f" under fsdp {mode}" if mode not in (None, "no") else ""
        raise SettingError("resume", f"{checkpoint} was written by {written} process{'es' if written != 1 else ''}{under} "
                           f"and this run has {processes}: resume it with {written} (the same --num_processes / machines x "
                           "processes per machine); its FSDP shards are one file per process")
