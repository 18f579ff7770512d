"""Asynchronous rollouts against the synchronous loop: step time at rollout.max_staleness K = 0, 1, 2 per row, each
run in its own process (`vlm-grpo bench --frameworks vlm-grpo`), and a markdown table.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/async_rollouts.py --rows balanced --out async.json
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/async_rollouts.py --rows wide,mid --out async-big.json

Each run is named by (K, trainer threads, worker threads). For a K = 0 run the ceiling of overlapping its two halves
is (generate + train) / max(generate, train), its rollout time as the generate half and the rest of the step as the
train half; an asynchronous run's speed-up is against the K = 0 run of the same row named in its `against`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS = {
    # generation and training take about the same time at 1 thread (small Qwen2.5-VL, no reference, 128 tokens)
    "balanced": ["--model", "preset:qwen2_5_vl_small", "--beta", "0", "--max-new-tokens", "128", "--steps", "4",
                 "--warmup", "2"],
    "wide": ["--model", "preset:qwen2_5_vl_wide_vocab", "--max-new-tokens", "512", "--batch-size", "2",
             "--num-generations", "4", "--steps", "2", "--warmup", "2"],
    "mid": ["--model", "preset:qwen2_5_vl_3b_2_layers", "--max-new-tokens", "256", "--batch-size", "2",
            "--num-generations", "4", "--steps", "2", "--warmup", "2"],
}
# (K, trainer threads, worker threads, the K = 0 run it is compared with)
RUNS = {
    "balanced": [(0, 1, 0, None), (1, 1, 1, (0, 1)), (2, 1, 1, (0, 1)), (0, 2, 0, None), (1, 1, 1, (0, 2))],
    "wide": [(0, 1, 0, None), (1, 1, 1, (0, 1)), (2, 1, 1, (0, 1)), (0, 2, 0, None)],
    "mid": [(0, 2, 0, None), (1, 1, 1, (0, 2)), (2, 1, 1, (0, 2))],
}


def run(row: str, k: int, threads: int, worker: int, work: Path) -> dict:
    out = work / f"{row}-k{k}-t{threads}-w{worker}.json"
    cmd = [sys.executable, "-m", "vlm_grpo.cli", "bench", *ROWS[row], "--frameworks", "vlm-grpo",
           "--threads", str(threads), "--max-staleness", str(k), "--worker-threads", str(worker), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())["results"]["vlm-grpo"]
    return {"row": row, "K": k, "threads": threads, "worker_threads": worker,
            "step_s": result["step_time_s"], "rollout_s": result["rollout_time_s"],
            "step_times_s": result["step_times_s"], "rollout_times_s": result["rollout_times_s"]}


def table(results: list[dict]) -> str:
    lines = ["| row | K | threads (trainer + worker) | step (s) | rollout wait (s) | speed-up | against | ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    base = {(r["row"], r["threads"]): r for r in results if r["K"] == 0}
    for r in results:
        if r["K"] == 0:
            gen, train = r["rollout_s"], r["step_s"] - r["rollout_s"]
            ceiling = f"{r['step_s'] / max(gen, train):.2f}x"
            lines.append(f"| {r['row']} | 0 | {r['threads']} | {r['step_s']:.2f} | {gen:.2f} | - | - | {ceiling} |")
            continue
        ref = base[(r["row"], r["against"][1])]
        lines.append(f"| {r['row']} | {r['K']} | {r['threads']} + {r['worker_threads']} | {r['step_s']:.2f} | "
                     f"{r['rollout_s']:.2f} | {ref['step_s'] / r['step_s']:.2f}x | K 0, {ref['threads']} thread(s) | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="balanced", help=f"comma-separated: {', '.join(ROWS)}")
    parser.add_argument("--out", default=None, help="the results as JSON")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        for row in args.rows.split(","):
            for k, threads, worker, against in RUNS[row]:
                results.append({**run(row, k, threads, worker, Path(work)), "against": against})
                print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
