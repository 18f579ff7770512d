"""Does asynchronous sampling cost learning? The default run (`vlm-grpo train`: the shipped tiny checkpoint, 200
steps, held-out accuracy before and after) at rollout.max_staleness K against K = 0, over seeds, each run in its own
process, one after another.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/async_learning.py --ks 0,1,2 --seeds 0,1,2 --out learn.json

Per run: the mean reward of each block of 50 steps and the held-out accuracy after. Per K: their mean over seeds
± the standard error across seeds, and the paired difference from K = 0 (seed by seed) with its standard error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BLOCK = 50


def run(k: int, seed: int, work: Path) -> dict:
    out = work / f"k{k}-s{seed}"
    cmd = [sys.executable, "-m", "vlm_grpo.cli", "train", "--seed", str(seed), "--output-dir", str(out),
           "--rollout.max_staleness", str(k), "--logging.progress", "false"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r and "stage" not in r]
    rewards = [r["reward"] for r in steps]
    before, after = (json.loads((out / f"eval-{when}.json").read_text()) for when in ("before", "after"))
    return {"K": k, "seed": seed, "rewards": rewards,
            "blocks": [statistics.fmean(rewards[i:i + BLOCK]) for i in range(0, len(rewards), BLOCK)],
            "accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"],
            "step_time_s": statistics.median(r["step_time"] for r in steps)}


def mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values) / len(values) ** 0.5:.3f}"


def table(results: list[dict]) -> str:
    ks = sorted({r["K"] for r in results})
    base = {r["seed"]: r for r in results if r["K"] == 0}
    blocks = len(results[0]["blocks"])
    head = " | ".join(f"reward, steps {b * BLOCK + 1}-{(b + 1) * BLOCK}" for b in range(blocks))
    lines = [f"| K | seeds | {head} | held-out after | step time (s) |", "|---" * (blocks + 4) + "|"]
    for k in ks:
        runs = [r for r in results if r["K"] == k]
        cells = " | ".join(mean_se([r["blocks"][b] for r in runs]) for b in range(blocks))
        lines.append(f"| {k} | {len(runs)} | {cells} | {mean_se([r['accuracy_after'] for r in runs])} | "
                     f"{mean_se([r['step_time_s'] for r in runs])} |")
    for k in ks:
        if k == 0:
            continue
        runs = [r for r in results if r["K"] == k and r["seed"] in base]
        cells = " | ".join(mean_se([r["blocks"][b] - base[r["seed"]]["blocks"][b] for r in runs])
                           for b in range(blocks))
        acc = mean_se([r["accuracy_after"] - base[r["seed"]]["accuracy_after"] for r in runs])
        lines.append(f"| {k} - 0 (paired) | {len(runs)} | {cells} | {acc} | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for k in [int(k) for k in args.ks.split(",")]:
                results.append(run(k, seed, Path(work)))
                print(json.dumps({key: v for key, v in results[-1].items() if key != "rewards"}), flush=True)
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
