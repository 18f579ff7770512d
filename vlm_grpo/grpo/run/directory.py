"""The run directory: locked by one run, created and checked writable before any model loads, never appended to by
accident, never written through links.

A run keeps the list of what it created (`.vlm-grpo-files.json`, grpo/safe_files.py), each entry with the inode
it wrote, and deletes or rewrites only those that still match: a list shipped with a folder (or an entry replaced
since) vouches for nothing, and what it names is left and named. A non-empty directory that is not a run (no such list) is refused unless the run resumes (`--resume`)
or is told to write there (`--overwrite-output-dir`); even then a file the run did not create that carries a run
file's name (a user's own `metrics.jsonl`) is refused, never replaced. A directory that already holds a run (its
checkpoints, final model, logged training steps) is refused unless the run resumes or replaces it
(`--overwrite-output-dir`, which removes only what the earlier run created). A directory holding only a failed
start (no checkpoint, no final model, no logged step) is not a run: a new run replaces the files it created, saying
so. The default directories (`runs/latest`, `runs/sft-latest`) are scratch space. A symlink or a hard-linked file
where a run file or folder goes is refused, on start and on resume, before anything is opened (exit 2).
Unfinished checkpoints an interrupted run left (`.tmp-checkpoint-*`) are removed at the start, under the lock, so
no other live run can be writing them.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

from vlm_grpo.file_kinds import not_a_folder
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.checkpoint.store import complete_checkpoints
from vlm_grpo.grpo.run.guard_report import AUDIT_FILE
from vlm_grpo.grpo.run.lock import LOCK_FILE, RunLock
from vlm_grpo.grpo.run.logs import METRICS
from vlm_grpo.grpo.safe_files import CREATED_LIST, STAGING_PREFIX, CreatedFiles
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.run.completion_files import COMPLETIONS_DIR
from vlm_grpo.grpo.run.tracker_setup import TRACKER_PROJECT, TRACKIO_FOLDER

SCRATCH_DIRS = ("runs/latest", "runs/sft-latest")
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "config.yaml", "before-after.txt", ".write-test", AUDIT_FILE,
             "errors.log", "report.html")  # errors.log: user-code tracebacks (grpo/user_calls.ERROR_LOG)
RUN_GLOBS = ("checkpoint-*", ".tmp-checkpoint-*", ".old-checkpoint-*", "final", ".tmp-final", "eval-*.json", "plots",
             TRACKER_PROJECT,  # the tracker logs' default project folder
             COMPLETIONS_DIR, TRACKIO_FOLDER)  # the per-step completions and their images; trackio's files
LEFTOVER_GLOBS = (".tmp-checkpoint-*", ".tmp-final", STAGING_PREFIX + "*")  # written, then renamed: never complete
# every top-level name a run opens: none may be a link (the lock file and the list of created files included)
GUARDED = (*RUN_FILES, *RUN_GLOBS, ".tmp-*", LOCK_FILE, CREATED_LIST, ".shared-dir-check-*")


def _is_run_name(name: str, patterns=(*RUN_FILES, *RUN_GLOBS)) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def run_artifacts(run_dir: Path) -> list[Path]:
    """Entries of `run_dir` that carry a run file's or folder's name (whoever made them)."""
    if not run_dir.is_dir():
        return []
    return [run_dir / n for n in sorted(os.listdir(run_dir)) if _is_run_name(n)]


def refuse_links(run_dir: Path) -> None:
    """A symlink or hard-linked file where a run file or folder goes, or inside a run folder: exit 2, naming it."""
    if run_dir.is_dir():
        safe_files.refuse_links(run_dir, [n for n in os.listdir(run_dir) if _is_run_name(n, GUARDED)])


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


def remove_leftovers(run_dir: Path, created: set[str] | None = None) -> list[str]:
    """Unfinished saves of an interrupted run (only those it created), removed; a checkpoint caught between the two
    renames of its replacement (`.old-checkpoint-N-*` with no `checkpoint-N`) is put back. Returns what was done."""
    listed = CreatedFiles(run_dir)
    created = listed.names() if created is None else created
    done, gone = [], []
    for pattern in LEFTOVER_GLOBS:
        for path in sorted(run_dir.glob(pattern)):
            if path.name in created or path.name.startswith(STAGING_PREFIX):
                safe_files.remove(path)
                gone.append(path.name)
                done.append(f"removed {path.name}, an unfinished save of an interrupted run")
    for path in sorted(run_dir.glob(".old-checkpoint-*")):
        if path.name not in created:
            continue
        step = path.name.split("-")[2]
        target = run_dir / f"checkpoint-{step}"
        if step.isdigit() and not os.path.lexists(target):
            path.rename(target)
            created.add(target.name)
            gone.append(path.name)
            done.append(f"restored {target.name} from {path.name} (its replacement was interrupted)")
        else:
            safe_files.remove(path)
            gone.append(path.name)
            done.append(f"removed {path.name}, a replaced checkpoint")
    created -= set(gone)
    if done and listed.exists:
        listed.save(created)
    return done


def _names(paths: list[Path], most: int = 4) -> str:
    return ", ".join(p.name for p in paths[:most]) + (" ..." if len(paths) > most else "")


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, keep_earlier: bool = False) -> RunLock:
    """Create `run_dir`, check it holds no links where run files go, lock it, check it can be written; refuse to mix
    a new run into an old one or into a user's folder (`keep_earlier`: the earlier run's files are moved into a dated
    folder inside it instead, and a folder of the user's own files is written into, none of them touched). Returns
    the held lock (released by the caller at the end)."""
    overwrite = overwrite or keep_earlier  # what is not the run's own is never touched either way
    blocked = not_a_folder(run_dir)
    if blocked:
        raise SettingError("logging.output_dir", f"{blocked}: pass a folder for the run (--output-dir), a new one or "
                           "a run's own")
    run_dir.mkdir(parents=True, exist_ok=True)
    refuse_links(run_dir)  # before the lock file is opened: a symlinked .run.lock would be written through
    listed = CreatedFiles(run_dir)
    is_run = listed.exists
    scratch = str(run_dir).rstrip("/") in SCRATCH_DIRS
    if not is_run and not (resume or overwrite or scratch):
        others = [run_dir / n for n in sorted(os.listdir(run_dir)) if n != LOCK_FILE]
        if others:
            raise SettingError("logging.output_dir", f"{run_dir} is not empty and holds no vlm-grpo run ({_names(others)}):"
                               " choose another --output-dir, or --overwrite-output-dir to write there anyway (files "
                               "the run did not create are never removed)")
    if not (resume or scratch):  # before the lock file is made: a refused start leaves nothing behind
        _refuse_foreign(run_dir, listed.names() if is_run else set())
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        created = listed.names()
        if (resume or scratch) and not is_run:  # a run from before runs kept their list: its run files are its own
            created = {p.name for p in run_artifacts(run_dir)}
            if created:
                listed.save(created)
        elif resume and listed.unverified():  # a run copied or moved here, resumed: --resume says it is yours
            created |= {p.name for p in run_artifacts(run_dir) if p.name in set(listed.unverified())}
            listed.save(created)
        notes = [lock.stale_note(), *remove_leftovers(run_dir, created)]
        _refuse_foreign(run_dir, created)
        old = [p for p in run_artifacts(run_dir) if p.name in created]
        if old and not resume:
            if not holds_a_run(run_dir):
                notes.append(f"replaced a failed start in {run_dir} (no checkpoint, final model or logged step): "
                             f"{', '.join(p.name for p in old)}")
            elif not overwrite and not scratch:
                raise SettingError("logging.output_dir", f"{run_dir} already holds a run ({_names(old)}): --resume "
                                   "continues it, --overwrite-output-dir replaces it, or choose another --output-dir")
            elif keep_earlier:
                kept = _move_aside(run_dir, old)
                notes.append(f"moved the earlier run in {run_dir} to {kept} ({_names(old)}): nothing was removed")
                old = []
            else:
                notes.append(f"replaced the earlier run in {run_dir}")
            for path in old:
                safe_files.remove(path)
            created = {n for n in created if (run_dir / n).exists()}
        listed.save(created)
        for note in filter(None, notes):
            print(note)
        _probe_writable(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def _move_aside(run_dir: Path, paths: list[Path]) -> Path:
    """The earlier run's files, moved (renamed, never copied) into `earlier-<UTC time of its last write>/`."""
    target = safe_files.dated_free_name(run_dir, "earlier-", max(p.stat().st_mtime for p in paths))
    target.mkdir()
    for path in paths:
        path.rename(target / path.name)
    return target


def _refuse_foreign(run_dir: Path, created: set[str]) -> None:
    foreign = [p for p in run_artifacts(run_dir) if p.name not in created and p.name != ".write-test"]
    if foreign:
        changed = [p for p in foreign if p.name in set(CreatedFiles(run_dir).unverified())]
        why = (f" ({_names(changed)}: listed in {CREATED_LIST}, but not the entry a run wrote there: a copied or "
               "shipped list, or a file replaced since)" if changed else "")
        raise SettingError("logging.output_dir", f"{run_dir} holds {_names(foreign)}, which no run here created, "
                           f"under the name of a file the run writes{why}: they are left as they are; move them away or "
                           "choose another --output-dir (a run never replaces a file it did not create)")


def _probe_writable(run_dir: Path) -> None:
    """A fresh file made and removed: the directory can be written (an error here names it before any model loads)."""
    probe = run_dir / f"{STAGING_PREFIX}probe-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    os.unlink(probe)
