"""Run by test_vllm_transport.py as a plain subprocess: the receiving side of a weight group (rank 0, which hosts the
group's store, as a vLLM server's engine worker 0 does). It joins at 127.0.0.1:PORT under TOKEN, receives each push
listed in SPECS (a JSON list of pushes, each a list of wire specs) and saves what arrived as OUT/push<k>.pt; a push
that fails to arrive is written as OUT/push<k>.err and the process exits with 3.

    python vllm_transport_worker.py PORT TOKEN SPECS OUT BUCKET_BYTES
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from vlm_grpo.grpo.rollout.vllm.transport import join_group  # noqa: E402
from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec  # noqa: E402


def main(port: str, token: str, specs: str, out: str, bucket_bytes: str) -> int:
    pushes = json.loads(Path(specs).read_text())
    group = join_group("127.0.0.1", int(port), rank=0, world_size=2, backend="gloo", token=token, timeout_s=60)
    try:
        for k, wire in enumerate(pushes):
            plan = [TensorSpec.from_wire(item) for item in wire]
            try:
                # a bucket's tensors are views of its buffer: keep copies, as a loader that holds them would
                items = [(name, tensor.clone()) for name, tensor in group.receive(plan, int(bucket_bytes))]
            except Exception as err:  # noqa: BLE001 - reported to the test
                Path(out, f"push{k}.err").write_text(f"{type(err).__name__}: {err}")
                return 3
            torch.save(items, Path(out, f"push{k}.pt"))
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
