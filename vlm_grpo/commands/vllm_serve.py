"""`vlm-grpo vllm-serve`: vLLM serving rollouts to trainers run with `rollout.vllm_mode: server` (TRL's `trl
vllm-serve`). The trainer pushes its weights to it after its optimizer steps; it refuses a trainer whose model differs."""

from __future__ import annotations

from vlm_grpo.commands.model_args import add_model_args, load_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("vllm-serve", help="serve vLLM rollouts to a trainer (rollout.vllm_mode server)")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (the trainer's vllm_server_host); "
                   "another than the loopback warns: see docs/vllm.md")
    p.add_argument("--port", type=int, default=8000, help="port (the trainer's vllm_server_port)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's, <= 4096)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="on a GPU: share of its memory")
    p.add_argument("--kvcache-gb", type=float, default=1.0, help="on a CPU: GiB of KV cache")
    p.add_argument("--api-key-file", default=None, help="a file holding the key every request must carry (default: "
                   "VLM_GRPO_VLLM_KEY, else a new key printed once at start)")
    p.set_defaults(func=run)


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
    from vlm_grpo.grpo.rollout.vllm.server import serve

    adapter = load_from_args(args, decide_cache=False)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_max_model_length": args.max_model_len})
    device = next(adapter.model.parameters()).device
    if made:  # printed once, here only: the trainer needs it
        print(f"vllm-serve: key {key} (give it to the trainer: `export {KEY_ENV}={key}`)", flush=True)
    serve(adapter, host=args.host, port=args.port, max_model_len=max_model_len(adapter, cfg), seed=args.seed,
          gpu_memory_utilization=args.gpu_memory_utilization, kvcache_gb=args.kvcache_gb, device=device, key=key)
    return 0
