"""One command per stage. Two experiment commands on one seed, or on seeds that share a compose and align
(`independent_seeds: false`), would otherwise write one folder at once: compose and align clear the partial work the
other is writing, two evals answer and write the same reports. Each stage runs holding an OS lock on
`<output_dir>/.locks/<stage folder>.lock` (the run lock's, with its record of the holder); a second command reaching
that stage is refused naming the first. Different stages of one seed still run side by side.

The lock is also where a stage's folders are checked: a symlink at any level below the experiment's output_dir (the
.locks folder, a seed folder, the stage folder) or inside the stage folder is refused before the stage writes, so
nothing an experiment writes goes through a planted link. output_dir itself is the user's to place."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

from vlm_grpo.experiment.plan import Experiment, ExperimentError
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.lock import RunLock


def stage_lock(exp: Experiment, stage: str, seed: int) -> RunLock:
    folder = exp.stage_dir(stage, seed)
    name = ".".join(folder.relative_to(exp.output_dir).parts)  # base-seed0.compose, seed1.eval

    def refuse(run_dir: Path, holder: str) -> Exception:
        return ExperimentError(f"seed {seed}: stage {stage} ({run_dir}) is being run by another command: {holder}; "
                               "wait for it to end, or stop it (a stopped stage resumes), then run this again")

    path = exp.output_dir / ".locks" / f"{name}.lock"
    safe_files.make_dirs_below(exp.output_dir, path.parent)
    safe_files.make_dirs_below(exp.output_dir, folder.parent)
    safe_files.check_below(exp.output_dir, folder)
    safe_files.check_tree(folder)
    return RunLock(folder, path=path, refuse=refuse)


@contextlib.contextmanager
def stage_held(exp: Experiment, stage: str, seed: int, say: Callable[[str], None]) -> Iterator[None]:
    lock = stage_lock(exp, stage, seed)
    lock.acquire()
    try:
        if note := lock.stale_note():
            say(note)
        yield
    finally:
        lock.release()
