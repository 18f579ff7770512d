"""`vlm-grpo env`: what a bug report needs: versions, the device, threads, the hub and cache settings, and the KV-cache
policy each family gets with the installed transformers (`--probe`: the probe run on every family's tiny twin)."""

from __future__ import annotations

import os
import platform

PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "huggingface_hub", "tokenizers", "safetensors",
            "pillow", "trl", "bitsandbytes", "qwen-vl-utils")
HUB_VARIABLES = ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="versions, device, threads, hub settings and each family's KV-cache policy")
    p.add_argument("--probe", action="store_true", help="also run the cache probe on every family's tiny twin")
    p.set_defaults(func=run)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _device_lines() -> list[str]:
    import torch

    lines = [f"  torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
             f"{os.cpu_count()} CPUs)"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(f"  cuda:{i}: {props.name}, {props.total_memory / 2**30:.1f} GiB, bf16 "
                         f"{'yes' if torch.cuda.is_bf16_supported() else 'no'}")
        lines.append(f"  mixed precision: bf16, fp16 (CUDA {torch.version.cuda})")
    else:
        from vlm_grpo.grpo.training.precision import cpu_bf16_flags

        flags = cpu_bf16_flags()
        native = f"native: {', '.join(flags)}" if flags else "emulated, slower than float32: no AMX-BF16 or AVX512-BF16"
        lines.append(f"  no CUDA device: training runs on the CPU; mixed precision bf16 ({native}), fp16 refused")
    return lines


def _cache_lines(probe: bool) -> list[str]:
    import transformers

    from vlm_grpo.adapters.registry import families
    from vlm_grpo.compat.known_quirks import known_cache_quirk

    lines = []
    for family, cls in sorted(families().items()):
        quirk = known_cache_quirk(family, transformers.__version__)
        if quirk is not None:
            verdict = f"no cache (known quirk for transformers {quirk.transformers})"
        elif probe:
            from vlm_grpo.compat.cache_probe import probe_cache

            report = probe_cache(cls.tiny(seed=0))
            verdict = "cache (probe agrees)" if report.cache_ok else "no cache (the probe disagrees)"
        else:
            verdict = "probed when a model loads (auto), no known quirk"
        lines.append(f"  {family:<13} {verdict}")
    return lines


def run(args) -> int:
    from vlm_grpo.version import __version__

    from vlm_grpo.compat.tested_window import outside_window, window_lines

    lines = [f"vlm-grpo {__version__}", f"python {platform.python_version()} on {platform.platform()}", "packages:"]
    lines += [f"  {name}: {_version(name)}" for name in PACKAGES]
    lines += ["tested window (installed, oldest .. newest tested; docs/compatibility.md):", *window_lines()]
    lines += [f"  WARNING: {line}" for line in outside_window()]
    lines += ["device:", *_device_lines(), "hub:"]
    lines += [f"  {name}={os.environ[name]}" for name in HUB_VARIABLES if name in os.environ] or ["  (defaults)"]
    import transformers

    lines += [f"KV cache policy per family (transformers {transformers.__version__}):", *_cache_lines(args.probe)]
    print("\n".join(lines))
    return 0
