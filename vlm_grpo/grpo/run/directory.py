"""The run directory: locked by one run, created and checked writable before any model loads, never appended to by
accident.

A directory that already holds a run (its checkpoints, final model, logged training steps) is refused unless the
run resumes (`--resume`) or replaces it (`--overwrite-output-dir`, which removes only what a run writes). A
directory holding only a failed start (no checkpoint, no final model, no logged step) is not a run: a new run
replaces it, saying so. The default directories (`runs/latest`, `runs/sft-latest`) are scratch space. Files a run
does not write are never touched. Unfinished checkpoints an interrupted run left (`.tmp-checkpoint-*`) are removed
at the start, under the lock, so no other live run can be writing them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vlm_grpo.grpo.run.checkpoints import complete_checkpoints
from vlm_grpo.grpo.run.lock import RunLock
from vlm_grpo.grpo.run.logs import METRICS
from vlm_grpo.grpo.settings.fields import SettingError
from vlm_grpo.grpo.run.completion_files import COMPLETIONS_DIR
from vlm_grpo.grpo.run.trackers import TRACKER_PROJECT, TRACKIO_FOLDER

SCRATCH_DIRS = ("runs/latest", "runs/sft-latest")
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "config.yaml", "before-after.txt", ".write-test", "report.html")
RUN_GLOBS = ("checkpoint-*", ".tmp-checkpoint-*", ".old-checkpoint-*", "final", ".tmp-final", "eval-*.json", "plots",
             TRACKER_PROJECT,  # the tracker logs' default project folder
             COMPLETIONS_DIR, TRACKIO_FOLDER)  # the per-step completions and their images; trackio's files
LEFTOVER_GLOBS = (".tmp-checkpoint-*", ".tmp-final")  # written, then renamed: never complete under these names


def run_artifacts(run_dir: Path) -> list[Path]:
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    return found + [p for pattern in RUN_GLOBS for p in sorted(run_dir.glob(pattern))]


def _logged_steps(run_dir: Path) -> bool:
    path = run_dir / METRICS
    if not path.is_file():
        return False
    for line in path.read_text(errors="replace").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) > 0:
                return True
        except (ValueError, TypeError, AttributeError):
            continue  # a line cut short by a kill
    return False


def holds_a_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run's work: a checkpoint, a final model or a logged training step."""
    return bool(complete_checkpoints(run_dir)) or (run_dir / "final").is_dir() or _logged_steps(run_dir)


def remove_leftovers(run_dir: Path) -> list[str]:
    """Unfinished checkpoints of an interrupted run, removed; a checkpoint caught between the two renames of its
    replacement (`.old-checkpoint-N-*` with no `checkpoint-N`) is put back. Returns what was done, one line each."""
    done = []
    for pattern in LEFTOVER_GLOBS:
        for path in sorted(run_dir.glob(pattern)):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
            done.append(f"removed {path.name}, an unfinished save of an interrupted run")
    for path in sorted(run_dir.glob(".old-checkpoint-*")):
        step = path.name.split("-")[2]
        target = run_dir / f"checkpoint-{step}"
        if step.isdigit() and not target.exists():
            path.rename(target)
            done.append(f"restored {target.name} from {path.name} (its replacement was interrupted)")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}, a replaced checkpoint")
    return done


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> RunLock:
    """Create `run_dir`, lock it, check it can be written; refuse to mix a new run into an old one. Returns the held
    lock (the caller releases it when the run ends)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        notes = [lock.stale_note(), *remove_leftovers(run_dir)]
        old = [p for p in run_artifacts(run_dir) if p.name != ".write-test"]
        if old and not resume:
            if not holds_a_run(run_dir):
                notes.append(f"replaced a failed start in {run_dir} (no checkpoint, final model or logged step): "
                             f"{', '.join(p.name for p in old)}")
            elif not overwrite and str(run_dir).rstrip("/") not in SCRATCH_DIRS:
                raise SettingError("logging.output_dir", f"{run_dir} already holds a run ({', '.join(p.name for p in old[:4])}"
                                   f"{' ...' if len(old) > 4 else ''}): --resume continues it, --overwrite-output-dir "
                                   "replaces it, or choose another --output-dir")
            else:
                notes.append(f"replaced the earlier run in {run_dir}")
            for path in old:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        for note in filter(None, notes):
            print(note)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except BaseException:
        lock.release()
        raise
    return lock
