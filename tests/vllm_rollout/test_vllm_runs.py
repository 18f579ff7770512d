"""GRPO runs with vLLM rollouts, each in its own process (one vLLM engine per process): a TRL user's settings in
colocate mode, a resume, server mode against `vlm-grpo vllm-serve` (the session's server, conftest.py), and a server
that refuses a mismatched trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

MODEL = ["--model", "preset:qwen2_5_vl_vllm_tiny", "--model.dtype", "float32"]
QUIET = ["--logging.progress", "false", "--guard.audit_at_start", "false", "--guard.reliance_every", "0"]
TRL_SETTINGS = """\
# a TRL user's GRPOConfig fields, unchanged
use_vllm: true
vllm_mode: colocate
vllm_importance_sampling_correction: true
vllm_importance_sampling_mode: token_truncate
vllm_importance_sampling_cap: 2.0
max_completion_length: 12
num_generations: 4
temperature: 1.0
learning_rate: 1.0e-4
max_steps: 3
save_steps: 3
"""


def _train(*words, timeout=400):
    out = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "train", *MODEL, *QUIET, *words],
                         capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_vllm_steps(rows, steps):
    assert [r["step"] for r in rows] == steps
    for r in rows:  # the correction ran: ratios and the engine-trainer gap logged, finite
        assert 0.0 < r["sampling/importance_sampling_ratio/mean"] <= 2.0
        assert 0.0 <= r["sampling/sampling_logp_difference/mean"] < 0.05
        assert r["perf/decode_tokens"] > 0
        # beta 0: the policy's image features, taken once with gradient before the rollout, serve both the ratio's
        # log-probs (detached, at the same weights) and the update: one encoder call per step
        assert r["perf/vision_calls"] == 1


def test_trl_settings_run_colocate_and_resume(tmp_path):
    config = tmp_path / "trl.yaml"
    config.write_text(TRL_SETTINGS)
    run = tmp_path / "run"
    _train("--config", str(config), "--output-dir", str(run))
    rows = _metrics(run)
    _check_vllm_steps(rows, [1, 2, 3])
    assert "vllm: true" not in (run / "config.yaml").read_text() and "engine: vllm" in (run / "config.yaml").read_text()
    # the weights moved and vLLM followed them: later steps' gap stays as small as the first's
    assert rows[-1]["sampling/sampling_logp_difference/max"] < 0.05
    _train("--config", str(config), "--output-dir", str(run), "--max-steps", "4", "--resume", "true")
    rows = _metrics(run)
    _check_vllm_steps(rows, [1, 2, 3, 4])


def test_server_mode_runs_three_steps(server, tmp_path):
    run = tmp_path / "run"
    _train("--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", str(server), "--max-steps", "3",
           "--max_completion_length", "12", "--output-dir", str(run))
    _check_vllm_steps(_metrics(run), [1, 2, 3])


def test_a_mismatched_trainer_is_refused(server, tmp_path):
    """The server serves the 128-wide preset; a trainer on the 256-wide one is refused at the handshake."""
    out = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "train", "--model", "preset:qwen2_5_vl_small",
                          "--model.dtype", "float32", *QUIET, "--use_vllm", "true", "--vllm_mode", "server",
                          "--vllm_server_port", str(server), "--max-steps", "1", "--output-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert out.returncode == 1
    assert "the vLLM server at http://127.0.0.1:" in out.stderr and "start the server with the trainer's --model" \
        in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "r" / "metrics.jsonl").exists() or not (tmp_path / "r" / "metrics.jsonl").read_text()


def test_server_mode_samples_one_step_ahead(server, tmp_path):
    """rollout.max_staleness 1: a thread asks the server for the next step's batch while this one trains; each new
    version is pushed once the older batch is answered."""
    run = tmp_path / "run"
    _train("--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", str(server), "--max-steps", "4",
           "--max_completion_length", "12", "--rollout.max_staleness", "1", "--learning-rate", "1e-3",
           "--output-dir", str(run))
    rows = _metrics(run)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["perf/decode_tokens"] > 0 and 0.0 < r["sampling/importance_sampling_ratio/mean"] for r in rows)
    assert all(r["perf/weight_sync_s"] > 0 for r in rows[1:])  # versions 1..3 pushed before their batches
    # a step's batch was sampled one version behind what it trains: the gap is larger than the engine's own
    assert max(r["sampling/sampling_logp_difference/max"] for r in rows[1:]) > rows[0]["sampling/sampling_logp_difference/max"]
