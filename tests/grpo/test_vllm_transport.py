"""The distributed weight transport (rollout/vllm/transport.py): the bucket plan both sides compute, a real gloo
weight group of two processes on 127.0.0.1 (this test's process sends as the trainer, a subprocess receives as the
server's engine worker 0 and hosts the store), the checks a send makes and where the group listens."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from vlm_grpo.grpo.rollout.vllm.transport import BUCKET_BYTES, join_group, plan_buckets
from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_transport_worker.py")
BUCKET = 256  # bytes: small enough that the pushes below hold several buckets and tensors that travel alone
HOST = "127.0.0.1"


def nbytes(spec: TensorSpec) -> int:
    return torch.empty(spec.shape, dtype=spec.dtype).nbytes


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(tensor.shape), tensor.dtype)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------- the plan
def random_specs(seed: int, limit: int) -> list[TensorSpec]:
    rng = random.Random(seed)
    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.uint8]
    specs = []
    for i in range(60):
        kind = rng.random()
        if kind < 0.1:
            shape: tuple[int, ...] = ()
        elif kind < 0.2:  # exactly the limit or above it
            shape = (limit // 2 + rng.randint(0, limit),)
        else:
            shape = (rng.randint(1, 9), rng.randint(1, 7))
        specs.append(TensorSpec(f"t{i}", shape, rng.choice(dtypes)))
    specs.append(TensorSpec("exact", (limit // 4,), torch.float32))  # exactly the limit: alone
    return specs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("limit", [64, 256, 1000])
def test_plan_covers_every_tensor_once_in_order_within_the_limit(seed, limit):
    specs = random_specs(seed, limit)
    plan = plan_buckets(specs, limit)
    assert [i for bucket in plan for i in bucket] == list(range(len(specs)))
    assert all(bucket for bucket in plan)
    for bucket in plan:
        size = sum(nbytes(specs[i]) for i in bucket)
        assert len(bucket) == 1 or size <= limit, (bucket, size)
        if any(nbytes(specs[i]) >= limit for i in bucket):
            assert len(bucket) == 1, bucket  # a tensor at least the limit travels alone
    for before, after in zip(plan, plan[1:]):  # a bucket closes only when the next tensor would not fit
        if len(after) == 1 and nbytes(specs[after[0]]) >= limit:
            continue
        if len(before) == 1 and nbytes(specs[before[0]]) >= limit:
            continue
        assert sum(nbytes(specs[i]) for i in before) + nbytes(specs[after[0]]) > limit, (before, after)
    assert any(len(bucket) > 1 for bucket in plan) and any(len(bucket) == 1 for bucket in plan)
    assert plan_buckets(specs, limit)[-1] == [len(specs) - 1]  # "exact" (== the limit) alone


def test_both_sides_plan_alike_from_the_wire():
    specs = random_specs(5, 256)
    received = [TensorSpec.from_wire(json.loads(json.dumps(s.as_wire()))) for s in specs]
    assert received == specs
    assert plan_buckets(received, 256) == plan_buckets(specs, 256)
    assert plan_buckets(specs) == [list(range(len(specs)))]  # all far below the default bucket: one broadcast
    assert plan_buckets([], 256) == []


def test_plan_edges():
    f32 = torch.float32
    assert plan_buckets([TensorSpec("a", (16,), f32), TensorSpec("b", (16,), f32)], 128) == [[0, 1]]  # 128 fits 128
    assert plan_buckets([TensorSpec("a", (16,), f32), TensorSpec("b", (17,), f32)], 128) == [[0], [1]]
    assert plan_buckets([TensorSpec("a", (1,), f32), TensorSpec("b", (32,), f32), TensorSpec("c", (1,), f32)],
                        128) == [[0], [1], [2]]
    assert plan_buckets([TensorSpec("big", (BUCKET_BYTES // 4,), f32)]) == [[0]]


def test_wire_spec_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorSpec.from_wire(["w", "float99", [2]])
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorSpec.from_wire(["w", "Tensor", [2]])  # a torch attribute that is not a dtype


# ---------------------------------------------------------------------------------------------- two processes
def aligned_push() -> list[tuple[str, torch.Tensor]]:
    """Several dtypes, a 0-dim tensor, tensors above the bucket size, many small ones, a non-contiguous one; every
    tensor a multiple of 8 bytes, so each starts aligned inside its bucket."""
    g = torch.Generator().manual_seed(0)
    items = [("step", torch.tensor(7, dtype=torch.int64)), ("ids", torch.tensor([1, -2, 2**40]))]
    items.append(("proj.weight", torch.randn(2, 3, generator=g)))
    items += [(f"layers.{i}.norm.weight", torch.randn(4, generator=g)) for i in range(24)]
    items += [(f"layers.{i}.bias", torch.randn(4, generator=g).to(torch.bfloat16)) for i in range(12)]
    items.append(("embed.weight", torch.randn(40, 40, generator=g).to(torch.bfloat16)))  # 3,200 bytes: alone
    items.append(("head.weight", torch.randn(8, 6, generator=g).t()))  # non-contiguous, 192 bytes: bucketed
    items.append(("half", torch.randn(8, generator=g).to(torch.float16)))
    items.append(("mask", torch.arange(16, dtype=torch.uint8)))
    items.append(("norm.weight", torch.randn(100, generator=g)))  # 400 bytes: alone
    items.append(("pi", torch.tensor(3.14159, dtype=torch.float32)))  # 0-dim float
    items.append(("tail", torch.randn(2, generator=g)))
    return items


def mixed_push() -> list[tuple[str, torch.Tensor]]:
    """One bucket of tensors whose byte sizes leave the next one unaligned for its dtype (a bf16 vector of odd length
    followed by an int64 and a float32), as a model mixing dtypes and odd sizes has."""
    g = torch.Generator().manual_seed(1)
    return [("a", torch.randn(3, generator=g)), ("b", torch.randn(3, generator=g).to(torch.bfloat16)),
            ("c", torch.tensor(5, dtype=torch.int64)), ("d", torch.randn(2, generator=g)),
            ("e", torch.randn(5, generator=g).to(torch.bfloat16)), ("f", torch.tensor([9, 10]))]


def listening(pid: int) -> list[tuple[str, int]]:
    return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
                  if c.status == psutil.CONN_LISTEN)


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
    """The two-process exchange, run once: what arrived on the receiving side, what each send raised, and the
    sockets each process listened on while the group was open."""
    out = tmp_path_factory.mktemp("transport")
    pushes = [aligned_push(), mixed_push()]
    (out / "specs.json").write_text(json.dumps([[spec_of(n, t).as_wire() for n, t in push] for push in pushes]))
    port, token = free_port(), "t0ken-for-this-test"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    mine_before = set(listening(os.getpid()))
    worker = subprocess.Popen([sys.executable, str(WORKER), str(port), token, str(out / "specs.json"), str(out),
                               str(BUCKET)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    report: dict = {"pushes": pushes, "port": port, "errors": {}}
    group = None
    try:
        deadline = time.monotonic() + 60
        while not any(p == port for _, p in listening(worker.pid)):  # the store is up
            assert worker.poll() is None and time.monotonic() < deadline, worker.communicate()[1][-3000:]
            time.sleep(0.05)
        group = join_group(HOST, port, rank=1, world_size=2, backend="gloo", token=token, timeout_s=60)
        report["worker_listening"] = listening(worker.pid)
        report["mine_listening"] = sorted(set(listening(os.getpid())) - mine_before)
        assert group.root == 1 and group.rank == 1
        for k, push in enumerate(pushes):
            try:
                report[f"sent{k}"] = group.send([spec_of(n, t) for n, t in push], iter(push), BUCKET)
            except Exception as err:  # noqa: BLE001 - the receiver's side says why
                report["errors"][k] = f"{type(err).__name__}: {err}"
                break
        _, stderr = worker.communicate(timeout=60)
        report["worker_rc"], report["worker_stderr"] = worker.returncode, stderr[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if group is not None:
            group.close()
    for k in range(len(pushes)):
        path = out / f"push{k}.pt"
        report[f"received{k}"] = torch.load(path) if path.is_file() else None
        err = out / f"push{k}.err"
        report[f"worker_error{k}"] = err.read_text() if err.is_file() else None
    return report


def assert_arrived(sent: list[tuple[str, torch.Tensor]], received) -> None:
    assert received is not None
    assert [n for n, _ in received] == [n for n, _ in sent]
    for (name, want), (_, got) in zip(sent, received):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name


def test_tensors_of_several_dtypes_arrive_bitwise_equal_and_in_order(exchange):
    push = exchange["pushes"][0]
    assert exchange["worker_error0"] is None, exchange["worker_error0"]
    assert_arrived(push, exchange["received0"])
    specs = [spec_of(n, t) for n, t in push]
    plan = plan_buckets(specs, BUCKET)
    assert any(len(b) > 1 for b in plan) and sum(len(b) == 1 and nbytes(specs[b[0]]) >= BUCKET for b in plan) >= 2
    assert exchange["sent0"] == sum(nbytes(s) for s in specs)


def test_a_bucket_of_mixed_dtypes_and_odd_sizes_arrives(exchange):
    """Tensors packed into one bucket arrive whatever their byte offsets in it (a bf16 vector of 3 then an int64)."""
    assert exchange["worker_error1"] is None, exchange["worker_error1"]
    assert exchange["errors"] == {}, exchange["errors"]
    assert_arrived(exchange["pushes"][1], exchange["received1"])
    assert exchange["worker_rc"] == 0, exchange["worker_stderr"]


def test_the_group_listens_on_the_given_address_only(exchange):
    """The store's socket (the port asked for) and gloo's own listening sockets, on both sides, while the group is
    open: 127.0.0.1, never every interface."""
    worker = exchange["worker_listening"]
    assert (HOST, exchange["port"]) in worker, worker
    assert all(ip == HOST for ip, _ in worker), worker
    assert len(worker) >= 2, worker  # the store and gloo's device
    mine = exchange["mine_listening"]  # the sender's gloo device, bound to the address that reaches the host
    assert mine and all(ip == HOST for ip, _ in mine), mine


# ---------------------------------------------------------------------------------------------- a send's checks
@pytest.fixture
def alone():
    """A group of one member (it hosts the store and is the root): a send's checks run before any broadcast."""
    group = join_group(HOST, free_port(), rank=0, world_size=1, backend="gloo", token="solo", timeout_s=20)
    yield group
    group.close()


def test_a_matching_send_to_a_group_of_one_passes(alone):
    push = aligned_push()
    assert alone.send([spec_of(n, t) for n, t in push], iter(push), BUCKET) == sum(t.nbytes for _, t in push)


@pytest.mark.parametrize("change", ["name", "shape", "dtype"])
def test_a_send_that_differs_from_its_specs_names_the_tensor(alone, change):
    push = aligned_push()
    specs = [spec_of(n, t) for n, t in push]
    k = 30  # a tensor in the middle of the push
    name, tensor = push[k]
    if change == "name":
        push[k] = ("layers.wrong.bias", tensor)
    elif change == "shape":
        push[k] = (name, tensor.reshape(2, 2))
    else:
        push[k] = (name, tensor.float())
    with pytest.raises(ValueError) as err:
        alone.send(specs, iter(push), BUCKET)
    assert push[k][0] in str(err.value) and name in str(err.value)


def test_a_send_with_a_tensor_beyond_its_specs_names_it(alone):
    push = aligned_push()
    specs = [spec_of(n, t) for n, t in push]
    with pytest.raises(ValueError, match="extra.weight"):
        alone.send(specs, iter(push + [("extra.weight", torch.zeros(2))]), BUCKET)


def test_a_send_whose_stream_ends_early_names_the_missing_tensor(alone):
    push = aligned_push()
    specs = [spec_of(n, t) for n, t in push]
    with pytest.raises(ValueError, match=push[-1][0]):
        alone.send(specs, iter(push[:-1]), BUCKET)


def test_join_refuses_an_unknown_backend_and_a_taken_port():
    with pytest.raises(ValueError, match="backend"):
        join_group(HOST, free_port(), rank=0, world_size=1, backend="mpi", token="x", timeout_s=5)
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen(1)
        with pytest.raises(RuntimeError, match="vllm_group_port"):
            join_group(HOST, taken.getsockname()[1], rank=0, world_size=1, backend="gloo", token="x", timeout_s=5)
