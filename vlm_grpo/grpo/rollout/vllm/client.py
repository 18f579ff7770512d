"""The trainer's side of server mode: the server proves it holds the key (before the trainer sends it anything keyed),
the handshake with a `vlm-grpo vllm-serve` server (server.py), then generate and weight pushes.

Every process of a launched run samples through the server; the main process alone pushes weights, streamed over
HTTP or broadcast over a torch.distributed group made at the handshake (`rollout.vllm_weight_transport`,
transport.py), while the other processes take part in gathering a sharded policy and then wait until the push is
in. A push that fails anywhere stops every process.

This module never imports the server's HTTP stack (FastAPI, uvicorn): the trainer talks with urllib, directly (no
proxy from the environment sees the key) and never following a redirect.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterable

import torch

from vlm_grpo.grpo.rollout.vllm import access
from vlm_grpo.grpo.rollout.vllm.access import HEADER, KEY_ENV
from vlm_grpo.grpo.rollout.vllm.engine import PROTOCOL, VLLMEngine
from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of
from vlm_grpo.grpo.rollout.vllm.transport import WeightGroup, join_group
from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec, model_signature
from vlm_grpo.grpo.rollout.vllm.wire import STREAM_NEEDS_ONE_WORKER, ServerMismatch, request_json, weight_frames


class ServerUnproven(RuntimeError):
    """The server at the trainer's address did not prove it holds the key: the trainer sent it nothing."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused, never followed: urllib would carry the key's header to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class ServerEngine(VLLMEngine):
    """The trainer's side of server mode: the proof and the handshake at start, then generate and weight pushes."""

    def __init__(self, adapter, cfg, root: torch.nn.Module | None = None, announce: bool = True):
        """`root`, `announce`: as ColocateEngine's (the trainer's prepared model; whether this process prints)."""
        r = cfg.rollout
        self.url = (r.vllm_server_base_url or f"http://{r.vllm_server_host}:{r.vllm_server_port}").rstrip("/")
        self.timeout = r.vllm_server_timeout
        self.key = access.client_key(r.vllm_server_key_file)
        if self.key is None:
            raise ValueError(f"rollout.vllm_mode server: the server's key is not given: set {KEY_ENV} (or "
                             "rollout.vllm_server_key_file) to the key `vlm-grpo vllm-serve` printed at start")
        self.adapter, self.root = adapter, root
        self.proven = False  # no request carries the key before the server proved it holds it
        self._opener = urllib.request.build_opener(_NoRedirect(), urllib.request.ProxyHandler({}))
        self.handshake()
        lora = self.info.get("lora")
        super().__init__(adapter, cfg, root, lora_supported=bool(lora),
                         lora_unsupported="the server runs without LoRA (vllm-serve --enable-lora)",
                         max_lora_rank=int(lora["max_rank"]) if lora else 0)
        if announce:
            print(self.lora.describe(), flush=True)
        if int(self.info.get("workers", 1)) > 1 and r.vllm_weight_transport == "http":
            raise ValueError(f"the vLLM server at {self.url}: "
                             + STREAM_NEEDS_ONE_WORKER.format(workers=self.info["workers"]))
        self.sends = _process_index() == 0  # the main process pushes; every process samples
        self.group: WeightGroup | None = None
        if self.sends and r.vllm_weight_transport == "distributed":
            self.group = self._join_weight_group(r.vllm_group_port)

    def _open(self, route: str, data, headers: dict[str, str]) -> dict:
        request = urllib.request.Request(self.url + route, data=data, headers=headers,
                                         method="POST" if data is not None else "GET")
        with self._opener.open(request, timeout=self.timeout) as response:
            return json.loads(response.read())

    def _call(self, route: str, data=None, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> dict:
        """One keyed request. `data`: bytes, or an iterable of byte chunks (sent chunked, never joined)."""
        if not self.proven:
            raise ServerUnproven(f"the vLLM server at {self.url} has not proven it holds the key: nothing keyed is "
                                 "sent to it before `handshake()`")
        try:
            return self._open(route, data, {"Content-Type": content_type, HEADER: f"Bearer {self.key}",
                                            **(headers or {})})
        except urllib.error.HTTPError as err:
            detail = _error_of(err)
            if err.code == 401:
                raise RuntimeError(f"the vLLM server at {self.url} refused the trainer's key: give the key the "
                                   f"server printed at start ({KEY_ENV} or rollout.vllm_server_key_file)") from None
            if err.code == 409:
                raise ServerMismatch(f"the vLLM server at {self.url} refused the trainer: {detail}") from None
            raise RuntimeError(f"the vLLM server at {self.url} failed {route}: {detail}") from None
        except urllib.error.URLError as err:
            raise self._unreachable(err.reason, route) from None
        except (OSError, http.client.HTTPException) as err:
            raise self._unreachable(err, route) from None

    def _unreachable(self, reason, route: str) -> RuntimeError:
        if not isinstance(reason, (ConnectionResetError, BrokenPipeError, TimeoutError, http.client.HTTPException)):
            return RuntimeError(f"no vLLM server answers at {self.url} ({reason}): start one with `vlm-grpo "
                                "vllm-serve --model SAME_MODEL`, or set rollout.vllm_mode colocate")
        return RuntimeError(f"the connection to the vLLM server at {self.url} broke during {route} "
                            f"({type(reason).__name__}: {reason}); the server's log says why")

    def prove(self) -> None:
        """The server answers a fresh nonce with the key's proof (access.py), or the trainer sends it nothing."""
        nonce = access.new_nonce()
        try:
            answer = self._open("/prove/", json.dumps({"nonce": nonce}).encode(), {"Content-Type": "application/json"})
            reason = "its proof does not match the trainer's key"
        except urllib.error.HTTPError as err:
            answer, reason = None, f"it answered /prove/ with HTTP {err.code}"
        except urllib.error.URLError as err:
            if isinstance(err.reason, (ConnectionRefusedError, socket.gaierror)):
                raise self._unreachable(err.reason, "/prove/") from None
            answer, reason = None, f"no proof came ({err.reason})"
        except (OSError, http.client.HTTPException) as err:
            answer, reason = None, f"no proof came ({type(err).__name__}: {err})"
        except ValueError:
            answer, reason = None, "its answer to /prove/ is not JSON"
        if not access.proves(answer.get("proof") if isinstance(answer, dict) else None, self.key, nonce):
            raise ServerUnproven(
                f"the server at {self.url} did not prove it holds the trainer's vLLM key ({reason}): nothing was "
                "sent to it (no key, no weights); start the server with `vlm-grpo vllm-serve` and give the trainer "
                "the key it printed, or correct rollout.vllm_server_base_url / vllm_server_host / vllm_server_port")
        self.proven = True

    def handshake(self) -> None:
        self.prove()
        info = self._call("/info/")
        mine = {"protocol": PROTOCOL, "architecture": architecture_of(self.adapter.model),
                "signature": model_signature(self.adapter.model, self.root)}
        for key, value in mine.items():
            if info.get(key) != value:
                raise ServerMismatch(
                    f"the vLLM server at {self.url} serves {info.get('architecture')} ({info.get('model')}, {key} "
                    f"{info.get(key)!r}), the trainer's model is {mine['architecture']} ({self.adapter.source}, "
                    f"{key} {value!r}): start the server with the trainer's --model")
        self.info = info

    def generate(self, reqs, options):
        version = self.version if self.lora.adapter_only else None
        body = {"requests": [request_json(r) for r in reqs], "sampling": options, "lora": version}
        return self._call("/generate/", json.dumps(body).encode())["results"]

    # ---------------------------------------------------------------- pushes
    def load_weights(self, items: Iterable[tuple[str, torch.Tensor]], specs: list[TensorSpec]) -> None:
        """The main process streams `items` (HTTP frames, or broadcasts over the weight group); the others gather
        their part of a sharded policy with it. Returns once the server holds them, on every process."""
        def send() -> None:
            if self.group is not None:
                self._broadcast("/update_weights_distributed/", {"tensors": [s.as_wire() for s in specs]},
                                "weights", specs, items)
            else:
                self._call("/update_weights/", weight_frames(items), content_type="application/octet-stream")

        self._push(send, items)

    def load_adapter(self, version: int, items: Iterable[tuple[str, torch.Tensor]], specs: list[TensorSpec]) -> None:
        def send() -> None:
            config = self.lora.config
            if self.group is not None:
                self._broadcast("/load_lora_distributed/", {"tensors": [s.as_wire() for s in specs],
                                                            "version": version, "config": config},
                                "adapter", specs, items)
            else:
                header = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
                self._call(f"/load_lora/?version={version}", weight_frames(items),
                           content_type="application/octet-stream", headers={"X-Adapter-Config": header})

        self._push(send, items)

    def _push(self, send, items) -> None:
        """`send()` on the main process; the others drain a sharded stream (its gathers are collectives). Then every
        process learns whether the push went through: a failure on the main process stops them all."""
        error: BaseException | None = None
        if self.sends:
            try:
                send()
            except BaseException as err:  # noqa: BLE001 - raised below, after the other processes know
                error = err
                if self.weights.root is not None:
                    for _ in items:  # the rest of the gathers, so the other processes are not left waiting
                        pass
        elif self.weights.root is not None:
            for _ in items:
                pass
        if not _all_agree(error is None):
            if error is not None:
                raise error
            raise RuntimeError(f"the main process's weight push to the vLLM server at {self.url} failed (its log "
                               "says why): every process stops")

    def _broadcast(self, route: str, announce: dict, job: str, specs: list[TensorSpec], items) -> None:
        """Announce a push (checked by the server before any byte moves), broadcast it, and wait until it is in."""
        self._call(route, json.dumps(announce).encode())
        try:
            self.group.send(specs, items)
        finally:
            self._call("/wait/", json.dumps({"job": job}).encode())

    def _join_weight_group(self, port: int) -> WeightGroup:
        """The weight group: the server's workers and this process (the last rank, which broadcasts)."""
        host = urllib.parse.urlsplit(self.url).hostname
        world = int(self.info["workers"]) + 1
        trainer_device = next(self.adapter.model.parameters()).device
        backend = "nccl" if self.info.get("device") == "cuda" and trainer_device.type == "cuda" else "gloo"
        token = secrets.token_urlsafe(32)
        self._call("/init_communicator/", json.dumps({"port": port, "world_size": world, "token": token,
                                                      "backend": backend, "timeout_s": self.timeout}).encode())
        try:
            group = join_group(host, port, rank=world - 1, world_size=world, backend=backend, token=token,
                               timeout_s=self.timeout, device=trainer_device if backend == "nccl" else None)
        except Exception as err:
            raise RuntimeError(f"the trainer could not join the vLLM server's weight group at {host}:{port} "
                               f"({type(err).__name__}: {str(err)[:200]}): the trainer must reach that port "
                               "(rollout.vllm_group_port), or use rollout.vllm_weight_transport http") from None
        self._call("/wait/", json.dumps({"job": "join"}).encode())
        return group

    def close(self) -> None:
        if self.group is not None:
            try:
                self._call("/close_communicator/", b"{}")
            except RuntimeError:  # the server went first: nothing left to close there
                pass
            self.group.close()
            self.group = None


def _process_index() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _all_agree(ok: bool) -> bool:
    """Whether every process of the run says ok (one process: its own word)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _error_of(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read() or b"{}").get("error", err.reason)
    except (ValueError, AttributeError, OSError):
        return str(err.reason)
