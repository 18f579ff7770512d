#!/usr/bin/env bash
# The vLLM cells a CPU cannot run, checked on one GPU in a few minutes: the weight push over NCCL (server mode,
# rollout.vllm_weight_transport distributed), colocate's memory, and bf16 weights end to end. Run it from the
# repository root in an environment with CUDA's vLLM (`pip install vllm`) and this project (`pip install -e .`):
#
#     bash scripts/gpu_vllm_check.sh [MODEL]        # MODEL default preset:qwen2_5_vl_3b (random weights, offline)
#
# It prints, and writes under ${OUT:-gpu-vllm-check}/: each run's metrics.jsonl, the server's log, the sync times per
# transport (benchmarks/vllm_weight_sync.py) and the GPU's peak memory; it exits non-zero when a check fails.
# A check passes when every step's `sampling/sampling_logp_difference/max` (vLLM's log-probs of the tokens it
# sampled against the trainer's recomputed ones, after the push) stays under TOLERANCE nats: bf16 kernels differ by
# more than the CPU's float32 (0.05 there).
set -euo pipefail
MODEL=${1:-preset:qwen2_5_vl_3b}
OUT=${OUT:-gpu-vllm-check}
TOLERANCE=${TOLERANCE:-0.5}
PORT=${PORT:-8011}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 VLM_GRPO_VLLM_KEY=${VLM_GRPO_VLLM_KEY:-gpu-check-$RANDOM$RANDOM$RANDOM}
PY=${PYTHON:-python}
COMMON=(--model "$MODEL" --model.dtype bfloat16 --use_vllm true --max-steps 3 --max_completion_length 32
        --logging.progress false --guard.audit_at_start false --guard.reliance_every 0)

check() {  # check NAME RUN_DIR: every step synced within TOLERANCE
  "$PY" - "$1" "$2/metrics.jsonl" "$TOLERANCE" <<'PY'
import json, sys
name, path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = [json.loads(line) for line in open(path)]
gaps = [r["sampling/sampling_logp_difference/max"] for r in rows]
syncs = [r.get("perf/weight_sync_s") for r in rows]
print(f"{name}: steps {[r['step'] for r in rows]}, logp gap max {['%.3f' % g for g in gaps]}, sync s {syncs}")
sys.exit(0 if len(rows) == 3 and max(gaps) < tol and all(s for s in syncs) else 1)
PY
}

echo "== colocate, bf16 (vLLM in the trainer's process)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$PY" -m vlm_grpo.cli train "${COMMON[@]}" --vllm_mode colocate --output-dir "$OUT/colocate" &
TRAIN=$!
PEAK=0
while kill -0 "$TRAIN" 2>/dev/null; do
  USED=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  [ "$USED" -gt "$PEAK" ] && PEAK=$USED
  sleep 1
done
wait "$TRAIN"
echo "colocate: peak GPU memory ${PEAK} MiB (nvidia-smi, sampled every second)"
check colocate "$OUT/colocate"

echo "== server mode, weights over NCCL"
"$PY" -m vlm_grpo.cli vllm-serve --model "$MODEL" --dtype bfloat16 --port "$PORT" --gpu-memory-utilization 0.4 \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf -H "Authorization: Bearer $VLM_GRPO_VLLM_KEY" "http://127.0.0.1:$PORT/health/" > /dev/null && break
  kill -0 "$SERVER" || { tail -50 "$OUT/server.log"; exit 1; }
  sleep 1
done
"$PY" -m vlm_grpo.cli train "${COMMON[@]}" --vllm_mode server --vllm_server_port "$PORT" \
  --vllm_weight_transport distributed --output-dir "$OUT/nccl"
check nccl "$OUT/nccl"
"$PY" -m vlm_grpo.cli train "${COMMON[@]}" --vllm_mode server --vllm_server_port "$PORT" \
  --vllm_weight_transport http --output-dir "$OUT/http"
check http "$OUT/http"
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
trap - EXIT

echo "== sync time per transport (bf16)"
"$PY" benchmarks/vllm_weight_sync.py --models "$MODEL" --dtype bfloat16 | tee "$OUT/sync.md"
