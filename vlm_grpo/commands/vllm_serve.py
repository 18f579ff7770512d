"""`vlm-grpo vllm-serve`: vLLM serving rollouts to trainers run with `rollout.vllm_mode: server` (TRL's `trl
vllm-serve`). The trainer pushes its weights to it after its optimizer steps; it refuses a trainer whose model differs."""

from __future__ import annotations

from vlm_grpo.commands.model_args import add_model_args, load_from_args
from vlm_grpo.grpo.rollout.vllm.lora_sync import MAX_RANKS


def add_parser(sub) -> None:
    p = sub.add_parser("vllm-serve", help="serve vLLM rollouts to a trainer (rollout.vllm_mode server)")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (the trainer's vllm_server_host); "
                   "another than the loopback warns: see docs/vllm.md")
    p.add_argument("--port", type=int, default=8000, help="port (the trainer's vllm_server_port)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's, <= 4096)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="on a GPU: share of its memory")
    p.add_argument("--kvcache-gb", type=float, default=1.0, help="on a CPU: GiB of KV cache")
    p.add_argument("--api-key-file", default=None, help="a file holding the key every request must carry, readable "
                   "by its owner only (chmod 600; default: VLM_GRPO_VLLM_KEY, else a new key printed once at start)")
    p.add_argument("--read-timeout", type=_seconds, default=30.0, help="seconds a connection has to send a whole "
                   "request head, and that a request body may stall, before it is dropped (default 30)")
    p.add_argument("--keep-alive-timeout", type=_seconds, default=5.0, help="seconds an idle keep-alive connection "
                   "stays open (default 5)")
    p.add_argument("--max-connections", type=_count, default=64, help="open connections at most; past it, the one "
                   "that has waited longest for its request head is closed (default 64; the process's open-file "
                   "limit is raised to fit, or the start refused)")
    p.add_argument("--tensor-parallel-size", type=_count, default=1, help="the engine over this many GPUs (vLLM's "
                   "worker processes); trainers then push weights over rollout.vllm_weight_transport distributed")
    p.add_argument("--enable-lora", action="store_true", help="take LoRA adapters from trainers (sent alone, applied "
                   "per request) instead of merged weights; their rank up to --max-lora-rank")
    p.add_argument("--max-lora-rank", type=int, default=64, choices=MAX_RANKS, metavar="R",
                   help=f"with --enable-lora: the largest adapter rank ({', '.join(map(str, MAX_RANKS))}; default 64)")
    p.set_defaults(func=run)


def _seconds(text: str) -> float:
    import argparse
    import math

    value = float(text)
    if not math.isfinite(value) or not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text}: seconds, above 0 and at most 86400")
    return value


def _count(text: str) -> int:
    import argparse

    value = int(text)
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{text}: from 1 to 100000")
    return value


def run(args) -> int:
    import sys

    from vlm_grpo.grpo.rollout.vllm.access import KEY_ENV, exposure_warning, server_key
    from vlm_grpo.grpo.rollout.vllm.runtime import import_vllm
    from vlm_grpo.grpo.settings.sections import TrainConfig

    key, made = server_key(args.api_key_file)  # a bad key file is refused before anything loads
    warning = exposure_warning(args.host)
    if warning:
        print(warning, file=sys.stderr)
    import_vllm()  # one line saying how to install it, before the model loads
    from vlm_grpo.grpo.rollout.vllm.runtime import max_model_len
    try:
        from vlm_grpo.grpo.rollout.vllm.server import serve
    except ImportError as err:
        raise RuntimeError(f"vllm-serve's HTTP server needs FastAPI and uvicorn: `pip install 'vlm-grpo[serve]'` "
                           f"({err})") from None

    adapter = load_from_args(args, decide_cache=False)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_max_model_length": args.max_model_len})
    device = next(adapter.model.parameters()).device
    if made:  # printed once, here only: the trainer needs it
        print(f"vllm-serve: key {key} (give it to the trainer: `export {KEY_ENV}={key}`)", flush=True)
    serve(adapter, host=args.host, port=args.port, max_model_len=max_model_len(adapter, cfg), seed=args.seed,
          gpu_memory_utilization=args.gpu_memory_utilization, kvcache_gb=args.kvcache_gb, device=device, key=key,
          read_timeout=args.read_timeout, keep_alive_timeout=args.keep_alive_timeout,
          max_connections=args.max_connections, max_lora_rank=args.max_lora_rank if args.enable_lora else 0,
          tensor_parallel_size=args.tensor_parallel_size)
    return 0
