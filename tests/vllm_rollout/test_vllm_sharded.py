"""vLLM under several processes (torchrun on CPU, gloo): FSDP2 and DDP, colocate (each process drives its own
engine) and server mode (the session's `vlm-grpo vllm-serve`, conftest.py; weights over HTTP or over a
torch.distributed group), full weights and LoRA adapters alone, resumes. After every push the engine's log-probs of the tokens it sampled equal
the trainer's recomputed ones (`sampling/sampling_logp_difference/max`, the maximum over processes, below TOLERANCE);
a control run whose engine is never synced shows that the check sees stale weights at this learning rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.vllm_rollout.conftest import free_port

MODEL = ["--model", "preset:qwen2_5_vl_vllm_tiny", "--model.dtype", "float32"]
QUIET = ["--logging.progress", "false", "--guard.audit_at_start", "false", "--guard.reliance_every", "0"]
# a learning rate at which one step moves the policy's log-probs far beyond TOLERANCE (the control shows it)
FAST = ["--use_vllm", "true", "--max_completion_length", "12", "--learning-rate", "3e-3"]
TOLERANCE = 0.05  # nats: vLLM's CPU kernels vs the trainer's float32 forward, with its suppressed ids excluded
STALE = 0.2  # nats: what a never-synced engine shows after one step at this learning rate, at least


def _run(*words, processes: int = 1, timeout: int = 600) -> subprocess.CompletedProcess:
    launch = [sys.executable, "-m"]
    if processes > 1:
        launch += ["torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), "-m"]
    out = subprocess.run([*launch, "vlm_grpo.cli", "train", *MODEL, *QUIET, *FAST, *words], capture_output=True,
                         text=True, timeout=timeout, env=os.environ.copy())
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return out


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_synced(rows, steps):
    assert [r["step"] for r in rows] == steps
    for r in rows:
        assert r["sampling/sampling_logp_difference/max"] < TOLERANCE, r
        assert r["perf/weight_sync_s"] > 0  # a push after every update (vllm_sync_steps 1)


def test_fsdp2_colocate_two_processes_stay_in_sync_and_resume(tmp_path):
    run = tmp_path / "run"
    out = _run("--fsdp", "full_shard", "--max-steps", "3", "--save_steps", "2", "--output-dir", str(run), processes=2)
    assert "vllm: merged weights synced: no LoRA" in out.stdout
    _assert_synced(_metrics(run), [1, 2, 3])
    # resume from step 2's checkpoint: each process's new engine gets the resumed policy at its first rollout
    _run("--fsdp", "full_shard", "--max-steps", "4", "--save_steps", "2", "--output-dir", str(run), "--resume", "true",
         processes=2)
    rows = _metrics(run)
    assert [r["step"] for r in rows][-2:] == [3, 4]
    _assert_synced(rows[-2:], [3, 4])


def test_ddp_colocate_lora_syncs_the_adapter_alone(tmp_path):
    run = tmp_path / "run"
    out = _run("--lora.r", "8", "--learning-rate", "3e-2", "--max-steps", "3", "--output-dir", str(run), processes=2)
    assert "vllm: LoRA adapter synced alone (rank 8)" in out.stdout
    _assert_synced(_metrics(run), [1, 2, 3])


def test_fsdp2_lora_merged_when_asked(tmp_path):
    run = tmp_path / "run"
    out = _run("--fsdp", "full_shard", "--lora.r", "8", "--learning-rate", "3e-2", "--vllm_lora_sync", "merged",
               "--max-steps", "2", "--output-dir", str(run), processes=2)
    assert "vllm: merged weights synced: rollout.vllm_lora_sync merged" in out.stdout
    _assert_synced(_metrics(run), [1, 2])


def test_the_check_sees_an_engine_that_was_not_synced(tmp_path):
    """The control: the same run with pushes only every 100 steps; after one update the gap is far above TOLERANCE."""
    run = tmp_path / "run"
    _run("--max-steps", "2", "--vllm_sync_steps", "100", "--output-dir", str(run))
    rows = _metrics(run)
    assert rows[0]["sampling/sampling_logp_difference/max"] < TOLERANCE  # the first rollout: just pushed
    assert rows[1]["sampling/sampling_logp_difference/max"] > STALE
    assert "perf/weight_sync_s" not in rows[1]


def _server(port: int, transport: str) -> list[str]:
    return ["--vllm_mode", "server", "--vllm_server_port", str(port), "--vllm_weight_transport", transport,
            "--vllm_group_port", str(free_port())]


def test_fsdp2_server_over_a_torch_distributed_group_stays_in_sync(server, tmp_path):
    """Two sharded trainers sample through one server; the main one gathers the shards unit by unit and broadcasts
    them over the gloo weight group into the engine's weights, in place."""
    run = tmp_path / "run"
    out = _run("--fsdp", "full_shard", *_server(server, "distributed"), "--max-steps", "3", "--output-dir", str(run),
               processes=2)
    assert "vllm: merged weights synced: no LoRA" in out.stdout
    _assert_synced(_metrics(run), [1, 2, 3])


def test_ddp_server_syncs_the_lora_adapter_alone_over_http(server, tmp_path):
    run = tmp_path / "run"
    out = _run("--lora.r", "8", "--learning-rate", "3e-2", *_server(server, "http"), "--max-steps", "3",
               "--output-dir", str(run), processes=2)
    assert "vllm: LoRA adapter synced alone (rank 8)" in out.stdout
    _assert_synced(_metrics(run), [1, 2, 3])


def test_lora_adapter_over_a_torch_distributed_group_and_resume(server, tmp_path):
    """The adapter alone over the weight group; the resumed trainer pushes its base again and numbers its adapters
    from 1, which the server takes (a whole push clears the adapters of the base it replaced)."""
    run = tmp_path / "run"
    lora = ["--lora.r", "8", "--learning-rate", "3e-2", "--save_steps", "2", "--output-dir", str(run)]
    out = _run(*lora, *_server(server, "distributed"), "--max-steps", "2")
    assert "vllm: LoRA adapter synced alone (rank 8)" in out.stdout
    _assert_synced(_metrics(run), [1, 2])
    _run(*lora, *_server(server, "distributed"), "--max-steps", "3", "--resume", "true")
    _assert_synced(_metrics(run)[-1:], [3])


def test_fsdp2_colocate_tensor_parallel_two_processes_drive_one_engine(tmp_path):
    """vllm_tensor_parallel_size 2 over 2 processes: one engine, its two tensor-parallel ranks; each process's prompts
    are gathered, sampled together and handed back, tool turns too (the zoom recipe's crop tool), so every process's
    rollout still matches its own policy."""
    run = tmp_path / "run"
    out = _run("--fsdp", "full_shard", "--vllm_tensor_parallel_size", "2", "--recipe", "zoom",
               "--max_completion_length", "16", "--max-steps", "2", "--output-dir", str(run), processes=2)
    assert "vllm: one engine over 2 processes (tensor parallel)" in out.stdout  # vLLM's own group says 2
    _assert_synced(_metrics(run), [1, 2])


def test_a_tensor_parallel_server_takes_weights_over_the_group_and_refuses_http(tensor_parallel_server, tmp_path):
    """Two vLLM worker processes receive each broadcast as ranks 0 and 1 of the weight group (the trainer is rank 2)
    and each loads its slice. HTTP cannot reach workers in other processes (vLLM pickles a call's arguments): the
    trainer is refused at the handshake, before it sends a tensor, naming the transport to use."""
    run = tmp_path / "run"
    _run(*_server(tensor_parallel_server, "distributed"), "--max-steps", "2", "--output-dir", str(run))
    _assert_synced(_metrics(run), [1, 2])
    refused = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "train", *MODEL, *QUIET, *FAST,
                              *_server(tensor_parallel_server, "http"), "--max-steps", "1",
                              "--output-dir", str(tmp_path / "http")], capture_output=True, text=True, timeout=300,
                             env=os.environ.copy())
    assert refused.returncode != 0
    assert "runs in 2 worker processes" in refused.stderr and "vllm_weight_transport distributed" in refused.stderr, \
        refused.stderr[-2000:]
