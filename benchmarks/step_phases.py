"""Where one vlm-grpo GRPO step spends its time, on the benchmark's settings (default B=4, G=8, T=64, beta 0.04).

    OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 python benchmarks/step_phases.py --model preset:hybrid_vit_heavy --threads 2
    HF_HUB_OFFLINE=1 python benchmarks/step_phases.py --model preset:qwen2_5_vl_wide_vocab --threads 1 \
        --batch-size 2 --num-generations 4 --max-new-tokens 512 --clock cpu

Wall-clock timers around the trainer's calls: the policy's image features taken before the rollout, the
rollout, the reference forward, the policy's image features and shared-prompt forward inside the update, the
backward and the optimizer update. One warm-up step, then `--steps` steps, one line each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import tempfile
import time
from pathlib import Path

import torch

import vlm_grpo.grpo.logprobs.completions as logprobs_module
import vlm_grpo.grpo.parts.sampler as sampler_module
import vlm_grpo.grpo.parts.trained_policy as update_module  # where the update step is called
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.bench.runners import _load, build_source
from vlm_grpo.bench.settings import BenchSettings
from vlm_grpo.grpo.settings.sources import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:hybrid_vit_heavy")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=BenchSettings.batch_size)
    parser.add_argument("--num-generations", type=int, default=BenchSettings.num_generations)
    parser.add_argument("--max-new-tokens", type=int, default=BenchSettings.max_new_tokens)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU seconds (steadier than wall time on a shared machine)")
    parser.add_argument("--train-flags", default="", help='further train flags, e.g. --train-flags="--perf.logprob_chunk_mb 16"')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    settings = BenchSettings(model=args.model, batch_size=args.batch_size, num_generations=args.num_generations,
                             max_new_tokens=args.max_new_tokens)
    work = Path(tempfile.mkdtemp())
    source = build_source(settings, work)
    cfg = load_config(overrides=[
        "--model", source, "--recipe", "shapes", "--data.recipe_options", json.dumps({"image_size": settings.image_size}),
        "--train-size", "64", "--batch-size", str(settings.batch_size), "--num-generations", str(settings.num_generations),
        "--max-new-tokens", str(settings.max_new_tokens), "--min-new-tokens", str(settings.max_new_tokens),
        "--beta", str(settings.beta), "--loss-type", settings.loss_type, "--learning-rate", str(settings.learning_rate),
        "--max-steps", str(args.steps + 1), "--output-dir", str(work / "run"), "--log-completions", "false",
        "--progress", "false", "--data.rewards", "letters=vlm_grpo.bench.runners:letter_share", *shlex.split(args.train_flags),
    ])
    seconds: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            started = clock()
            try:
                return fn(*a, **kw)
            finally:
                seconds[name] = seconds.get(name, 0.0) + clock() - started
        return wrapper

    with contextlib.redirect_stdout(None):
        trainer = GRPOTrainer.from_settings(cfg, adapter=_load(source, torch.device("cpu")))
    sampler_module.image_features = timed("features before rollout", sampler_module.image_features)
    sampler_module.rollout = timed("rollout", sampler_module.rollout)
    update_module.update_step = timed("optimizer", update_module.update_step)
    trainer.scorer.reference_logps = timed("reference forward", trainer.scorer.reference_logps)
    logprobs_module.image_features = timed("features in forwards", logprobs_module.image_features)
    logprobs_module.shared_prompt_scores = timed("LM forwards", logprobs_module.shared_prompt_scores)
    trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
    print(f"{args.model}, B={args.batch_size} G={args.num_generations} T={args.max_new_tokens}, {args.threads} thread(s), "
          f"{args.clock} seconds per phase (reference forward includes its features and LM "
          "forward; 'features in forwards' and 'LM forwards' count the reference's and the policy's)")
    trainer.train_step(0)
    for step in range(1, args.steps + 1):
        seconds.clear()
        started = clock()
        trainer.train_step(step)
        total = clock() - started
        print("  ".join(f"{k} {v:.2f}" for k, v in seconds.items()) + f"  | step {total:.2f}")


if __name__ == "__main__":
    main()
