"""The run directory: created and checked writable before any model loads, never appended to by accident.

A directory that already holds a run (its logs, checkpoints, final model) is refused unless the run resumes
(`--resume`) or replaces it (`--overwrite-output-dir`, which removes only what a run writes). The default
directories (`runs/latest`, `runs/sft-latest`) are scratch space: a new run replaces the last one there.
Files a run does not write are never touched. The resolved settings go to `config.yaml` at the start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vlm_grpo.grpo.settings.fields import SettingError
from vlm_grpo.grpo.run.trackers import TRACKER_PROJECT

SCRATCH_DIRS = ("runs/latest", "runs/sft-latest")
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "config.yaml", "before-after.txt", ".write-test")
RUN_GLOBS = ("checkpoint-*", ".tmp-checkpoint-*", ".old-checkpoint-*", "final", ".tmp-final", "eval-*.json", "plots",
             TRACKER_PROJECT)  # the tracker logs' default project folder


def run_artifacts(run_dir: Path) -> list[Path]:
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    return found + [p for pattern in RUN_GLOBS for p in sorted(run_dir.glob(pattern))]


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Create `run_dir` and check it can be written; refuse to mix a new run into an old one."""
    old = [p for p in run_artifacts(run_dir) if p.name != ".write-test"] if run_dir.is_dir() else []
    if old and not resume:
        if not overwrite and str(run_dir).rstrip("/") not in SCRATCH_DIRS:
            raise SettingError("logging.output_dir", f"{run_dir} already holds a run ({', '.join(p.name for p in old[:4])}"
                               f"{' ...' if len(old) > 4 else ''}): --resume continues it, --overwrite-output-dir "
                               "replaces it, or choose another --output-dir")
        for path in old:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        print(f"replaced the earlier run in {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    probe = run_dir / ".write-test"
    probe.write_text("ok")
    probe.unlink()
