"""Weights from the trainer into a vLLM server's engine over torch.distributed (`rollout.vllm_weight_transport:
distributed`): a process group of their own, made at the handshake, gloo on a CPU and NCCL on a GPU.

The group's members: the server's engine workers (ranks 0..W-1; worker 0 hosts the rendezvous store on the server's
host at `rollout.vllm_group_port`, as TRL's vllm-serve does) and the trainer's main process (rank W, the root of
every broadcast). The store's listening socket is bound to the server's own address (torch's TCPStore would listen on
every interface), and every key the group writes is under a one-time token the trainer sent over the authenticated
HTTP call, so a process that reaches the port without that call cannot join. The tensors themselves travel
unencrypted and unauthenticated, as NCCL's always do: keep the port on a trusted network (docs/vllm.md).

A push is planned from the tensors' names, shapes and dtypes alone (both sides know them before any byte moves):
consecutive small tensors share one broadcast of a flat byte bucket, a large one goes alone, so the number of
collectives stays small while memory stays bounded by one bucket or one tensor.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec

BACKENDS = ("gloo", "nccl")
BUCKET_BYTES = 64 * 2**20  # tensors below this travel packed together; the bucket is the transfer's memory bound
ALIGN = 16  # bytes: each packed tensor starts at a multiple of this, so it can be viewed as its own dtype
STORE_PREFIX = "vlm-grpo-weights"


def _nbytes(spec: TensorSpec) -> int:
    count = 1
    for d in spec.shape:
        count *= d
    return count * torch.empty((), dtype=spec.dtype).element_size()


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of `specs` grouped into broadcasts, in order: runs of tensors packed up to `bucket_bytes`, a tensor
    at least that large alone. Both sides compute the same plan from the same specs."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, spec in enumerate(specs):
        n = _nbytes(spec)
        if n >= bucket_bytes:
            if current:
                buckets.append(current)
                current, size = [], 0
            buckets.append([i])
            continue
        if size + n > bucket_bytes and current:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _offsets(specs: list[TensorSpec], bucket: list[int]) -> tuple[list[int], int]:
    """Where each of a bucket's tensors starts in its flat buffer (aligned), and the buffer's size."""
    offsets, end = [], 0
    for i in bucket:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + _nbytes(specs[i])
    return offsets, end


@dataclass
class WeightGroup:
    """One side's handle on the weight group: `send` on the trainer (the root), `receive` on an engine worker."""

    group: object  # torch's ProcessGroupGloo / ProcessGroupNCCL
    rank: int
    world_size: int
    device: torch.device
    store: object  # kept alive while the group lives

    @property
    def root(self) -> int:
        return self.world_size - 1

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = torch.distributed.BroadcastOptions()
        options.rootRank = self.root
        options.rootTensor = 0
        self.group.broadcast([tensor], options).wait()

    def send(self, specs: list[TensorSpec], items: Iterable[tuple[str, torch.Tensor]],
             bucket_bytes: int = BUCKET_BYTES) -> int:
        """Broadcast `items` (in `specs`' order, names and shapes checked) from the root; returns the tensors' bytes
        (a bucket's alignment padding not counted)."""
        sent = 0
        stream = iter(items)
        for bucket in plan_buckets(specs, bucket_bytes):
            tensors = []
            for i in bucket:
                spec = specs[i]
                item = next(stream, None)
                if item is None:
                    raise ValueError(f"weight push: the stream ended at tensor {i} of {len(specs)} ({spec.name} was "
                                     "planned next)")
                name, tensor = item
                if name != spec.name or tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                    raise ValueError(f"weight push: tensor {i} is {name} {tuple(tensor.shape)} {tensor.dtype}, the "
                                     f"plan said {spec.name} {spec.shape} {spec.dtype}")
                tensors.append(tensor.to(self.device))
            if len(tensors) == 1:
                flat = tensors[0].detach().contiguous()
            else:
                offsets, size = _offsets(specs, bucket)
                flat = torch.zeros(size, dtype=torch.uint8, device=self.device)
                for start, tensor in zip(offsets, tensors):
                    data = _as_bytes(tensor)
                    flat[start:start + data.numel()] = data
            self._broadcast(flat)
            sent += sum(_nbytes(specs[i]) for i in bucket)
        leftover = next(stream, None)
        if leftover is not None:
            raise ValueError(f"weight push: {leftover[0]} is beyond the {len(specs)} tensors planned")
        return sent

    def receive(self, specs: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """The root's tensors as they arrive, in `specs`' order (a bucket's tensors are views of its buffer)."""
        for bucket in plan_buckets(specs, bucket_bytes):
            if len(bucket) == 1:
                spec = specs[bucket[0]]
                tensor = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
                self._broadcast(tensor)
                yield spec.name, tensor
                continue
            offsets, size = _offsets(specs, bucket)
            flat = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._broadcast(flat)
            for i, start in zip(bucket, offsets):
                spec = specs[i]
                yield spec.name, flat[start:start + _nbytes(spec)].view(spec.dtype).reshape(spec.shape)

    def close(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError:  # already torn down by the other side
                pass
        self.group = None
        self.store = None


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise RuntimeError(f"the weight group cannot listen on {host}:{port} ({err.strerror or err}): choose another "
                           "rollout.vllm_group_port") from None
    sock.listen(64)
    return sock


def local_address(host: str, port: int) -> str:
    """The address of this machine that reaches `host` (the one gloo should listen on for the other side)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        return sock.getsockname()[0]


def join_group(host: str, port: int, *, rank: int, world_size: int, backend: str, token: str, timeout_s: float,
               device: torch.device | None = None) -> WeightGroup:
    """Join (rank 0: host) the weight group at host:port. Blocks until all `world_size` members have joined."""
    if backend not in BACKENDS:
        raise ValueError(f"weight group backend {backend!r}: one of {', '.join(BACKENDS)}")
    timeout = datetime.timedelta(seconds=timeout_s)
    dist = torch.distributed
    if rank == 0:
        listener = _listening_socket(host, port)
        try:
            store = dist.TCPStore(host, port, world_size, True, timeout=timeout, wait_for_workers=False,
                                  master_listen_fd=listener.detach())
        except Exception:
            listener.close()
            raise
    else:
        store = dist.TCPStore(host, port, world_size, False, timeout=timeout)
    scoped = dist.PrefixStore(f"{STORE_PREFIX}/{token}/", store)
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        address = host if rank == 0 else local_address(host, port)
        wildcard = address in ("0.0.0.0", "::", "")  # a server listening everywhere: gloo picks the host's address
        options._devices = [dist.ProcessGroupGloo.create_default_device() if wildcard
                            else dist.ProcessGroupGloo.create_device(hostname=address)]
        group = dist.ProcessGroupGloo(scoped, rank, world_size, options)
        device = torch.device("cpu")
    else:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        device = device or torch.device("cuda", torch.cuda.current_device())
        group = dist.ProcessGroupNCCL(scoped, rank, world_size, options)
    return WeightGroup(group, rank, world_size, device, store)
