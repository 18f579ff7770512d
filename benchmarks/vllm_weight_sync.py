"""How long a weight sync takes, per transport and model size: the trainer's whole push (gathering, sending,
the engine's in-place load and cache reset) into a vLLM engine, as `perf/weight_sync_s` logs it in a run.

Transports: colocate (the engine in the trainer's process, tensors handed over in memory), server over HTTP (frames
streamed over the server's port) and server over torch.distributed (a gloo group made at the handshake; NCCL on a
GPU). Run in the vLLM venv (`make test-vllm` builds it), alone on a quiet machine:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1 \
        .venv-vllm/bin/python benchmarks/vllm_weight_sync.py

Each row: the median of --pushes pushes after one warm-up push, the bytes pushed and the rate. The model's weights
are float32 (vLLM's CPU dtype); the same script on a GPU measures bf16 with NCCL (scripts/gpu_vllm_check.sh).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.loader import load_model

KEY = "weight-sync-bench-key-0123456789"
MODELS = ["preset:qwen2_5_vl_vllm_tiny", "preset:qwen2_5_vl_small", "preset:qwen2_5_vl_3b_2_layers"]
TRANSPORTS = ["colocate", "http", "distributed"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, dtype: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vlm_grpo.cli", "vllm-serve", "--model", model, "--dtype", dtype,
                             "--port", str(port), "--gpu-memory-utilization", "0.4"],  # beside colocate's engine on a GPU
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "VLM_GRPO_VLLM_KEY": KEY})
    deadline = time.time() + 600
    while True:
        try:
            health = urllib.request.Request(f"http://127.0.0.1:{port}/health/", headers={"Authorization": f"Bearer {KEY}"})
            urllib.request.urlopen(health, timeout=2).read()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"vllm-serve did not come up: {log.read_text()[-3000:]}")
            time.sleep(1)


def timed_pushes(engine, pushes: int) -> list[float]:
    """Wall seconds of `pushes` pushes after the one the engine made when it opened (the warm-up)."""
    before = len(engine.push_seconds)
    for _ in range(pushes):
        engine.push()
    return engine.push_seconds[before:]


def open_engine(adapter, transport: str, port: int | None, device: torch.device):
    from vlm_grpo.grpo.rollout.vllm.modes import open_engine as open_named

    rollout = {"engine": "vllm", "vllm_mode": "colocate"} if transport == "colocate" else {
        "engine": "vllm", "vllm_mode": "server", "vllm_server_port": port, "vllm_weight_transport": transport,
        "vllm_group_port": free_port(), "vllm_server_timeout": 600.0}
    return open_named(adapter, TrainConfig(rollout=rollout), device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--transports", nargs="+", default=TRANSPORTS, choices=TRANSPORTS)
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--server-log", default=None, help="keep the server's log here (default: a temporary file)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ["VLM_GRPO_VLLM_KEY"] = KEY
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for model in args.models:
        adapter = load_model(model, dtype=getattr(torch, args.dtype), device=device, decide_cache=False)
        params = sum(p.numel() for p in adapter.model.parameters())
        server = None
        with tempfile.TemporaryDirectory() as tmp:
            try:
                for transport in args.transports:
                    if transport != "colocate" and server is None:
                        server = start_server(model, args.dtype, Path(args.server_log or Path(tmp) / "server.log"))
                    engine = open_engine(adapter, transport, server[1] if server else None, device)
                    try:
                        nbytes = sum(torch.Size(s.shape).numel() * s.dtype.itemsize for s in engine.weights.specs())
                        times = timed_pushes(engine, args.pushes)
                    finally:
                        engine.close()
                    median = statistics.median(times)
                    row = (f"| {model} | {params / 1e6:.1f}M | {nbytes / 2**20:.1f} MiB | {transport} | "
                           f"{median:.3f} s | {nbytes / 2**30 / median:.2f} GiB/s | "
                           f"{', '.join(f'{t:.3f}' for t in times)} |")
                    print(row, flush=True)
                    rows.append(row)
            finally:  # a failed row must not leave the server holding the machine's memory
                if server is not None:
                    server[0].terminate()
                    server[0].wait(timeout=60)
        del adapter
    print("\n| model | parameters | pushed | transport | median push | rate | pushes (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
