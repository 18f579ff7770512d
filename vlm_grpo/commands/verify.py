"""`vlm-grpo verify RUN_DIR`: check every checkpoint (and final/) of a run against its manifest."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check a run's checkpoints against their manifests (sizes, sha256)")
    p.add_argument("run_dir", help="training run directory")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.grpo.checkpoint.store import complete_checkpoints
    from vlm_grpo.grpo.checkpoint.manifest import verify

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    found = [path for _, path in complete_checkpoints(run_dir)]
    if (run_dir / "final").is_dir():
        found.append(run_dir / "final")
    if not found:
        print(f"{run_dir}: no checkpoints")
        return 1
    bad = 0
    for path in found:
        problems = verify(path)
        bad += bool(problems)
        print(f"{path.name}: {'OK' if not problems else 'DAMAGED: ' + '; '.join(problems)}")
    return 1 if bad else 0
