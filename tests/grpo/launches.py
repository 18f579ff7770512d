"""Launching the CLI under accelerate or torchrun as one machine or as several simulated on loopback (127.0.0.1):
each simulated machine is its own launcher process, as on a cluster, and they meet at the main process's port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false"]
DDP = ["--multi_gpu"]  # on a machine without GPUs accelerate runs CPU processes over gloo
FSDP = ["--use_fsdp", "--fsdp_version", "2"]  # accelerate's own options; on CPU the program shards with fully_shard
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--mixed_precision", "no", "--dynamo_backend", "no"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TIMEOUT = 600


def cli(*args) -> list[str]:
    return ["-m", "vlm_grpo.cli", *map(str, args)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_node(kind: list[str], machines: int, rank: int, per_machine: int, port: int) -> list[str]:
    """`accelerate launch` for machine `rank` of `machines` (--num_processes counts every machine's processes)."""
    return [*ACCELERATE, *kind, "--num_machines", str(machines), "--machine_rank", str(rank), "--num_processes",
            str(machines * per_machine), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]


def torchrun_node(machines: int, rank: int, per_machine: int, port: int) -> list[str]:
    return [*TORCHRUN, "--nnodes", str(machines), "--node_rank", str(rank), "--nproc_per_node", str(per_machine),
            "--master_addr", "127.0.0.1", "--master_port", str(port)]


def run_machines(commands: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start every machine's launcher at once and wait for all of them (a hung rendezvous is killed at TIMEOUT)."""
    procs = [subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for cmd in commands]
    done = []
    try:
        for cmd, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=TIMEOUT)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # each launcher leads its own session: it and its workers
                proc.wait()
    return done


def succeeded(done: list[subprocess.CompletedProcess]) -> None:
    for rank, result in enumerate(done):
        assert result.returncode == 0, f"machine {rank}:\n" + result.stdout[-2000:] + result.stderr[-4000:]


def on_machines(kind: list[str], machines: int, per_machine: int, program) -> None:
    """accelerate launch as `machines` machines of `per_machine` processes; `program(rank)` is machine rank's."""
    port = free_port()
    succeeded(run_machines([accelerate_node(kind, machines, r, per_machine, port) + program(r) for r in range(machines)]))
