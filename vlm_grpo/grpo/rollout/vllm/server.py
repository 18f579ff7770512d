"""vLLM in its own process: `vlm-grpo vllm-serve --model SPEC`, the server.

FastAPI on uvicorn (the stack vLLM ships) wrapping one `LLM`; routes named as TRL's trl/scripts/vllm_serve.py where
they do the same. `VLLMServer` is the one place that talks to the engine, and every call into the engine runs on
one engine thread (calls are serialized; the event loop keeps answering). Every route but /prove/ needs the
server's key (access.py: 401 before any body byte is read); sampling options are an allow-list (400):

- GET  /health/            -> 200 once the engine is built
- GET  /info/              -> the handshake: protocol, vlm-grpo and vLLM versions, architecture, weight signature
- POST /prove/             -> {nonce} -> {proof}: the server shows it holds the key before the trainer sends it
- POST /generate/          -> {requests, sampling, lora} (wire.py) -> results
- POST /update_weights/    -> the policy's weights as a stream of frames (wire.py), loaded one tensor at a time
- POST /load_lora/?version=N -> a LoRA adapter's matrices as frames (its peft config in X-Adapter-Config), the
                              adapter later /generate/ calls name (`vllm-serve --enable-lora`)
- POST /init_communicator/ -> {port, world_size, token, backend, timeout_s}: the engine's workers join the trainer's
                              weight group (transport.py); POST /wait/ {job: "join"} answers once it formed
- POST /update_weights_distributed/ -> {tensors: [[name, dtype, shape], ...]}: the workers receive them by broadcast
                              (/wait/ {job: "weights"} answers once loaded); /load_lora_distributed/ likewise
- POST /close_communicator/
- POST /reset_prefix_cache/

uvicorn (0.54, 0.55) has no deadline for a request head or a stalled body: a connection that sends half a head holds
its socket forever, and `limit_concurrency` counts such connections, answering even the trainer 503 once they reach
it while it goes on accepting until the process runs out of files. So a connection here (`Connection`) must deliver
each request head within `read_timeout` seconds, a body that stalls that long is dropped (408), an idle keep-alive
connection closes after `keep_alive_timeout`, and at most `max_connections` are open: past it, the connection that
has waited longest for its head makes room.

The trainer (client.py) refuses a server whose model or protocol differs from the trainer's (the handshake), naming
both.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator

import h11
import torch
import uvicorn
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from vlm_grpo.grpo.rollout.vllm import access
from vlm_grpo.grpo.rollout.vllm.access import HEADER, KEY_ENV, AccessError
from vlm_grpo.grpo.rollout.vllm.engine import PROTOCOL
from vlm_grpo.grpo.rollout.vllm.lora_sync import AdapterVersions
from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of, build_llm, llm_generate, llm_load_weights, reset_caches
from vlm_grpo.grpo.rollout.vllm.transport import BACKENDS
from vlm_grpo.grpo.rollout.vllm.weights import PolicyWeights, TensorSpec, signature
from vlm_grpo.grpo.rollout.vllm.wire import STREAM_NEEDS_ONE_WORKER, ByteStream, ServerMismatch, native_requests, \
    read_weights

log = logging.getLogger(__name__)

READ_TIMEOUT = 30.0  # seconds for a request head, and for each stall of a body
KEEP_ALIVE_TIMEOUT = 5.0  # seconds an idle keep-alive connection stays open (uvicorn's default)
MAX_CONNECTIONS = 64
SMALL_BODY = 4096  # bytes: every body but /generate/'s and /update_weights/'
SPARE_FILES = 32  # open files the process needs beside the engine's and the connections'
MANIFEST_BODY = 64 * 2**20  # bytes: a push's list of tensors (names, dtypes, shapes) or an adapter's config
HANDOFF_DEPTH = 2  # tensors read ahead of the engine during a weight push
__all__ = ["ServerMismatch", "VLLMServer", "http_server", "make_app", "serve"]


# ---------------------------------------------------------------- the state: the one place that talks to the engine
class VLLMServer:
    """One engine over one model directory, and what it answers. `generate`, `load_weights` and `reset_prefix_cache`
    run on the engine thread (the routes await them through `on_engine`); the checks run anywhere."""

    def __init__(self, model_dir: str, architecture: str, shapes: dict[str, tuple[int, ...]], llm, *, key: str,
                 max_model_len: int, vllm_version: str, engine_thread: ThreadPoolExecutor | None = None,
                 adapters: AdapterVersions | None = None, max_lora_rank: int = 0, group_host: str = "127.0.0.1",
                 device: str = "cpu", workers: int = 1):
        """`adapters`: where LoRA adapters go (None: the engine takes none); `group_host`: the address the weight
        group's rendezvous listens on (the server's own); `workers`: the engine's worker processes (its ranks)."""
        from vlm_grpo.version import __version__

        self.llm, self.key, self.max_model_len = llm, key, max_model_len
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.adapters, self.max_lora_rank, self.group_host = adapters, max_lora_rank, group_host
        self.info = {"protocol": PROTOCOL, "vlm_grpo": __version__, "vllm": vllm_version, "model": model_dir,
                     "architecture": architecture, "signature": signature(architecture, self.shapes.items()),
                     "workers": workers, "device": device,
                     "lora": {"max_rank": max_lora_rank} if adapters is not None else None}
        self.engine_thread = engine_thread or ThreadPoolExecutor(1, thread_name_prefix="vllm-engine")
        self.broken_push: str | None = None  # why the engine may hold a mix of two pushes' weights
        self.jobs: dict[str, asyncio.Future] = {}  # engine-thread work a trainer started and waits for (/wait/)

    async def on_engine(self, fn: Callable[..., Any], *args) -> Any:
        """`fn(*args)` on the engine thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.engine_thread, fn, *args)

    def close(self) -> None:
        self.engine_thread.shutdown(wait=False, cancel_futures=True)

    # -- on the engine thread
    def generate(self, reqs: list[dict], options: dict, lora: int | None = None) -> list[dict]:
        if self.broken_push is not None:
            raise AccessError(409, f"a weight push failed part-way ({self.broken_push}), so the engine may hold a mix "
                              "of old and new weights: the trainer must push its whole model again before generating")
        return llm_generate(self.llm, reqs, options, lora_request=self.adapter_request(lora))

    def load_weights(self, items: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Every tensor of the model, checked by name and shape as it comes, into the engine. Until a push completes,
        /generate/ is refused: a push that fails part-way leaves the engine half old, half new."""
        seen: set[str] = set()
        refused: list[AccessError] = []

        def checked() -> Iterator[tuple[str, torch.Tensor]]:
            try:
                for name, tensor in items:
                    self.check_tensor(name, tuple(tensor.shape))
                    if name in seen:
                        raise AccessError(409, f"tensor {name!r} came twice in one push")
                    seen.add(name)
                    yield name, tensor
                missing = [name for name in self.shapes if name not in seen]
                if missing:
                    raise AccessError(409, f"the push lacks {len(missing)} of the model's {len(self.shapes)} tensors "
                                      f"(first: {missing[0]!r}): push the whole model")
            except AccessError as err:
                refused.append(err)  # vLLM may wrap what its loader raised: the refusal stays ours
                raise

        self.broken_push = "the push did not finish"
        try:
            llm_load_weights(self.llm, checked())
        except Exception as err:
            self.broken_push = str(refused[0] if refused else err)[:300]
            if refused:
                raise refused[0] from None
            raise
        self.pushed_whole()
        return len(seen)

    def pushed_whole(self) -> None:
        """A whole model is in: no half push, and no adapter of the weights it replaced (a trainer that syncs LoRA
        alone pushes its base first and numbers its adapters from 1 again, as a resumed one does)."""
        self.broken_push = None
        if self.adapters is not None:
            self.adapters.clear()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def join_group(self, port: int, world_size: int, token: str, backend: str, timeout_s: float) -> int:
        """The engine's workers join the trainer's weight group (worker.py); blocks until it formed."""
        self.llm.collective_rpc("vlm_grpo_join", args=(self.group_host, port, world_size, token, backend, timeout_s))
        return world_size

    def leave_group(self) -> None:
        self.llm.collective_rpc("vlm_grpo_leave")

    def receive_weights(self, specs: list[TensorSpec]) -> int:
        """The whole model, broadcast by the trainer over the weight group, into the engine (checked beforehand)."""
        self.broken_push = "the push did not finish"
        try:
            self.llm.collective_rpc("vlm_grpo_receive", args=([s.as_wire() for s in specs],))
            reset_caches(self.llm)
        except Exception as err:
            self.broken_push = str(err)[:300]
            raise
        self.pushed_whole()
        return len(specs)

    def receive_adapter(self, version: int, config: dict, specs: list[TensorSpec]) -> int:
        tensors = self.llm.collective_rpc("vlm_grpo_receive_tensors", args=([s.as_wire() for s in specs],))[0]
        return self.load_adapter(version, config, tensors.items())

    def load_adapter(self, version: int, config: dict, items: Iterable[tuple[str, torch.Tensor]]) -> int:
        """A LoRA adapter as the engine's adapter `version` (written as peft files vLLM's LoRA request loads)."""
        items = list(items)
        self.adapters.add(config, items, version)
        return len(items)

    def adapter_request(self, version: int | None):
        if version is None:
            return None
        if self.adapters is None:
            raise AccessError(409, "this server runs without LoRA (vllm-serve --enable-lora): a generate call named "
                              f"adapter {version}")
        try:
            return self.adapters.request(version)
        except ValueError as err:
            raise AccessError(409, str(err)) from None

    # -- checks (any thread)
    def check_tensor(self, name: str, shape: tuple[int, ...]) -> None:
        if name not in self.shapes:
            raise AccessError(409, f"tensor {name!r} is not a weight of this server's model "
                              f"({self.info['architecture']}, {self.info['model']}): start the server with the "
                              "trainer's --model")
        if tuple(shape) != self.shapes[name]:
            raise AccessError(409, f"tensor {name!r} has shape {list(shape)}; this server's model has "
                              f"{list(self.shapes[name])}: start the server with the trainer's --model")

    def check_specs(self, specs: list[TensorSpec]) -> None:
        """A whole push announced before any byte of it: every tensor of the model, once, with its shape."""
        seen: set[str] = set()
        for spec in specs:
            self.check_tensor(spec.name, spec.shape)
            if spec.name in seen:
                raise AccessError(409, f"tensor {spec.name!r} is announced twice in one push")
            seen.add(spec.name)
        missing = [name for name in self.shapes if name not in seen]
        if missing:
            raise AccessError(409, f"the push lacks {len(missing)} of the model's {len(self.shapes)} tensors (first: "
                              f"{missing[0]!r}): push the whole model")

    def check_adapter(self, version: Any, config: Any) -> tuple[int, dict]:
        """An adapter push's version (newer than the engine's) and peft config (plain LoRA within the rank)."""
        if self.adapters is None:
            raise AccessError(409, "this server runs without LoRA: start it with `vlm-grpo vllm-serve --enable-lora "
                              "--max-lora-rank R`, or train with rollout.vllm_lora_sync merged")
        if isinstance(version, bool) or not isinstance(version, int) or not self.adapters.version < version < 2**31:
            raise AccessError(409, f"adapter version {str(version)[:40]}: an integer above the engine's "
                              f"{self.adapters.version}")
        rank = config.get("r") if isinstance(config, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank <= self.max_lora_rank:
            raise AccessError(409, f"an adapter of rank {str(rank)[:20]}: this server takes ranks up to "
                              f"{self.max_lora_rank} (vllm-serve --max-lora-rank)")
        if config.get("use_dora") or config.get("modules_to_save"):
            raise AccessError(409, "a DoRA adapter, or one with modules_to_save, is not one vLLM applies")
        return version, config

    def check_adapter_tensor(self, name: str, shape: tuple[int, ...]) -> None:
        if not any(f".{part}." in name for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")) \
                or len(shape) != 2 or min(shape) > self.max_lora_rank:
            raise AccessError(409, f"tensor {name[:200]!r} {list(shape)} is not a LoRA matrix of rank <= "
                              f"{self.max_lora_rank}")

    def start(self, job: str, fn: Callable[..., Any], *args) -> None:
        """`fn(*args)` on the engine thread, awaited later by /wait/ (the trainer meanwhile sends its side)."""
        pending = [name for name, future in self.jobs.items() if not future.done()]
        if pending:
            raise AccessError(409, f"{pending[0]} is still in progress: /wait/ for it first")
        self.jobs[job] = asyncio.ensure_future(self.on_engine(fn, *args))

    async def wait(self, job: str) -> Any:
        future = self.jobs.pop(job, None)
        if future is None:
            raise AccessError(409, f"no {job} was started")
        return await future

    async def push_weights(self, tensors: AsyncIterator[tuple[str, torch.Tensor]],
                           load: Callable[[Iterator], Any] | None = None) -> int:
        """Tensors as they arrive into `load_weights` on the engine thread, at most HANDOFF_DEPTH read ahead. The engine
        is not touched before the first tensor has come and passed its check."""
        first = await anext(tensors, None)
        if first is None:
            raise AccessError(409, f"the push holds none of the model's {len(self.shapes)} tensors")
        handoff = _Handoff(asyncio.get_running_loop())
        job = asyncio.ensure_future(self.on_engine(handoff.consume, load or self.load_weights))
        try:
            item = first
            while item is not None and await handoff.put(item):
                item = await anext(tensors, None)
        except BaseException as err:
            handoff.finish(PushCut(str(err)[:300] or type(err).__name__))
            try:
                await job
            except Exception:  # noqa: BLE001 - the reader's error is the answer
                pass
            raise
        handoff.finish()
        return await job


class PushCut(RuntimeError):
    """The weight stream failed before the engine had every tensor."""


class _Handoff:
    """Tensors from the event loop (the body's reader) to the engine thread, at most HANDOFF_DEPTH waiting."""

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.items, self.room = loop, queue.SimpleQueue(), asyncio.Semaphore(HANDOFF_DEPTH)
        self.stopped = False  # the engine side took its last item

    async def put(self, item) -> bool:
        """False once the engine stopped taking (its own error is then the push's answer)."""
        if not self.stopped:
            await self.room.acquire()
        if self.stopped:
            return False
        self.items.put(item)
        return True

    def finish(self, error: BaseException | None = None) -> None:
        self.items.put(error if error is not None else self._END)

    def consume(self, load: Callable[[Iterator], Any]) -> Any:
        """On the engine thread: `load(tensors)`, then no more waiting on either side."""
        tensors = self._taken()
        try:
            return load(tensors)
        finally:
            tensors.close()
            self.stopped = True
            self._release()

    def _taken(self) -> Iterator:
        while True:
            item = self.items.get()
            self._release()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _release(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.room.release)
        except RuntimeError:  # the loop is gone (the server stopped): nobody waits
            pass


# ---------------------------------------------------------------- routes: one small handler each
async def health(state: VLLMServer, request: Request) -> dict:
    return {"status": "ok"}


async def info(state: VLLMServer, request: Request) -> dict:
    return state.info


async def prove(state: VLLMServer, request: Request) -> dict:
    body = await json_body(request, SMALL_BODY)
    return {"proof": access.proof(state.key, access.checked_nonce(body.get("nonce") if isinstance(body, dict)
                                                                   else None))}


async def generate(state: VLLMServer, request: Request) -> dict:
    body = await json_body(request, access.MAX_GENERATE_BYTES)
    if not isinstance(body, dict) or set(body) - {"requests", "sampling", "lora"}:
        raise AccessError(400, "a /generate/ body is {requests: [...], sampling: {...}, lora: null or an adapter id}")
    lora = body.get("lora")
    if lora is not None and (isinstance(lora, bool) or not isinstance(lora, int) or not 0 <= lora < 2**31):
        raise AccessError(400, f"lora={str(lora)[:40]}: null or an adapter id (an integer >= 0)")
    prompts = len(body["requests"]) if isinstance(body.get("requests"), list) else 1
    options = access.checked_sampling(body.get("sampling", {}), max_model_len=state.max_model_len, requests=prompts)
    reqs = await asyncio.to_thread(native_requests, body.get("requests"), max_model_len=state.max_model_len,
                                   max_requests=access.MAX_REQUESTS)  # decoding PNGs: off the event loop
    return {"results": await state.on_engine(state.generate, reqs, options, lora)}


async def update_weights(state: VLLMServer, request: Request) -> dict:
    stream = ByteStream(request.stream())
    try:
        if state.info["workers"] > 1:
            raise AccessError(409, STREAM_NEEDS_ONE_WORKER.format(workers=state.info["workers"]))
        return {"updated": await state.push_weights(read_weights(stream, state.check_tensor))}
    except Exception as err:
        if not (isinstance(err, AccessError) and err.status == 408):
            try:  # the trainer may still be sending: it gets this answer rather than a broken pipe
                await stream.drain()
            except Exception:  # noqa: BLE001 - a stall or a hang-up while draining: the answer stays the same
                pass
        raise


async def reset_prefix_cache(state: VLLMServer, request: Request) -> dict:
    await state.on_engine(state.reset_prefix_cache)
    return {"status": "ok"}


async def load_lora(state: VLLMServer, request: Request) -> dict:
    try:
        version = int(request.query_params.get("version", ""))
        config = json.loads(base64.urlsafe_b64decode(request.headers.get("x-adapter-config", "")))
    except ValueError:
        raise AccessError(400, "/load_lora/ takes ?version=N and the adapter's peft config as base64 JSON in "
                          "X-Adapter-Config") from None
    version, config = state.check_adapter(version, config)
    stream = ByteStream(request.stream())
    tensors = read_weights(stream, state.check_adapter_tensor)
    return {"updated": await state.push_weights(tensors, lambda items: state.load_adapter(version, config, items))}


def _specs(body: Any, route: str) -> list[TensorSpec]:
    tensors = body.get("tensors") if isinstance(body, dict) else None
    if not isinstance(tensors, list) or not tensors:
        raise AccessError(400, f"{route} takes {{tensors: [[name, dtype, shape], ...]}}")
    try:
        return [TensorSpec.from_wire(t) for t in tensors]
    except (TypeError, ValueError) as err:
        raise AccessError(400, f"{route}: {err}"[:300]) from None


async def init_communicator(state: VLLMServer, request: Request) -> dict:
    body = await json_body(request, SMALL_BODY)
    body = body if isinstance(body, dict) else {}
    port, world, token = body.get("port"), body.get("world_size"), body.get("token")
    backend, timeout = body.get("backend"), body.get("timeout_s")
    workers = state.info["workers"]
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise AccessError(400, f"/init_communicator/: port {str(port)[:20]}: 1 to 65535")
    if world != workers + 1:
        raise AccessError(409, f"/init_communicator/: a weight group of {str(world)[:20]}; this server's engine has "
                          f"{workers} worker(s) and the trainer makes one more")
    if not isinstance(token, str) or not access.NONCE.fullmatch(token):
        raise AccessError(400, "/init_communicator/: token: 32 to 256 url-safe characters")
    if backend not in BACKENDS or (backend == "nccl" and state.info["device"] != "cuda"):
        raise AccessError(409, f"/init_communicator/: backend {str(backend)[:20]!r}: this server's engine runs on "
                          f"{state.info['device']} ({'gloo or nccl' if state.info['device'] == 'cuda' else 'gloo'})")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
        raise AccessError(400, "/init_communicator/: timeout_s: seconds, above 0 and at most 86400")
    state.start("join", state.join_group, port, world, token, backend, float(timeout))
    return {"started": "join"}


async def update_weights_distributed(state: VLLMServer, request: Request) -> dict:
    specs = _specs(await json_body(request, MANIFEST_BODY), "/update_weights_distributed/")
    state.check_specs(specs)
    state.start("weights", state.receive_weights, specs)
    return {"started": "weights"}


async def load_lora_distributed(state: VLLMServer, request: Request) -> dict:
    body = await json_body(request, MANIFEST_BODY)
    specs = _specs(body, "/load_lora_distributed/")
    version, config = state.check_adapter(body.get("version"), body.get("config"))
    for spec in specs:
        state.check_adapter_tensor(spec.name, spec.shape)
    state.start("adapter", state.receive_adapter, version, config, specs)
    return {"started": "adapter"}


async def wait(state: VLLMServer, request: Request) -> dict:
    body = await json_body(request, SMALL_BODY)
    job = body.get("job") if isinstance(body, dict) else None
    if job not in ("join", "weights", "adapter"):
        raise AccessError(400, "/wait/ takes {job: join, weights or adapter}")
    return {job: await state.wait(job)}


async def close_communicator(state: VLLMServer, request: Request) -> dict:
    await state.on_engine(state.leave_group)
    return {"status": "ok"}


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[VLLMServer, Request], Awaitable[dict]]
    keyed: bool = True  # needs `Authorization: Bearer KEY`
    max_body: int | None = SMALL_BODY  # bytes (None: streamed, bounded by the handler)


ROUTES = [
    Route("GET", "/health/", health),
    Route("GET", "/info/", info),
    Route("POST", "/prove/", prove, keyed=False),
    Route("POST", "/generate/", generate, max_body=access.MAX_GENERATE_BYTES),
    Route("POST", "/update_weights/", update_weights, max_body=None),
    Route("POST", "/reset_prefix_cache/", reset_prefix_cache),
    Route("POST", "/load_lora/", load_lora, max_body=None),
    Route("POST", "/init_communicator/", init_communicator),
    Route("POST", "/update_weights_distributed/", update_weights_distributed, max_body=MANIFEST_BODY),
    Route("POST", "/load_lora_distributed/", load_lora_distributed, max_body=MANIFEST_BODY),
    Route("POST", "/wait/", wait),
    Route("POST", "/close_communicator/", close_communicator),
]


async def json_body(request: Request, limit: int) -> Any:
    """The request's body as JSON, refused past `limit` bytes (a chunked body too) or when it is no JSON."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise AccessError(413, f"{request.url.path}: a body of more than {limit} bytes")
        chunks.append(chunk)
    try:
        return await asyncio.to_thread(json.loads, b"".join(chunks))
    except (UnicodeDecodeError, ValueError) as err:
        raise AccessError(400, f"{request.url.path}: the body is not JSON ({err})"[:300]) from None


def answer(status: int, payload: dict, *, close: bool = False) -> Response:
    # json.dumps, not Starlette's JSONResponse: a log-prob of -inf must travel as today
    headers = {"connection": "close"} if close else None
    return Response(json.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def _endpoint(state: VLLMServer, route: Route):
    async def endpoint(request: Request) -> Response:
        # every refusal closes the connection: a body left unread is never taken for the next request
        try:
            return answer(200, await route.handler(state, request))
        except AccessError as err:
            return answer(err.status, {"error": str(err)}, close=True)
        except ServerMismatch as err:
            return answer(409, {"error": str(err)}, close=True)
        except ClientDisconnect:
            return answer(400, {"error": f"{route.path}: the client went away before its body ended"}, close=True)
        except ValueError as err:  # vLLM's own refusal of a request (a prompt longer than the context ...)
            return answer(400, {"error": f"{type(err).__name__}: {err}"[:1000]}, close=True)
        except Exception as err:  # the trainer gets the reason in one line; the server keeps serving
            log.exception("vllm-serve: %s failed", route.path)
            return answer(500, {"error": f"{type(err).__name__}: {err}"[:1000]}, close=True)

    endpoint.__name__ = route.handler.__name__
    return endpoint


class Guard:
    """In front of every route: a request without the key (401) or with too long a declared body (413) is answered
    before any body byte is read; a body that stalls `read_timeout` seconds is dropped (408)."""

    def __init__(self, app, *, key: str, read_timeout: float):
        self.app, self.key, self.read_timeout = app, key, read_timeout
        self.routes = {r.path: r for r in ROUTES}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"].endswith("/") else scope["path"] + "/"  # /health as /health/
        scope = {**scope, "path": path}
        route = self.routes.get(path)
        headers = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
        if (route is None or route.keyed) and not (len(headers) == 1 and access.authorized(headers[0], self.key)):
            return await answer(401, {"error": f"this server needs its key: send `{HEADER}: Bearer KEY` (the trainer "
                                      f"reads it from {KEY_ENV} or rollout.vllm_server_key_file)"},
                                close=True)(scope, receive, send)
        declared = [v for k, v in scope["headers"] if k == b"content-length"]
        try:
            size = int(declared[0]) if declared else 0
        except ValueError:
            size = -1
        if size < 0 or (route is not None and route.max_body is not None and size > route.max_body):
            limit = route.max_body if route is not None else 0
            return await answer(413 if size > 0 else 400, {"error": f"{path}: Content-Length {declared[0][:40]!r}: "
                                                           f"at most {limit} bytes"}, close=True)(scope, receive, send)

        body_left = [size > 0 or any(k == b"transfer-encoding" for k, _ in scope["headers"])]

        async def receive_in_time():
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout)
            except asyncio.TimeoutError:
                raise AccessError(408, f"{path}: the body stalled for {self.read_timeout:g} s (--read-timeout): "
                                  "dropped") from None
            if not message.get("more_body", False):
                body_left[0] = False
            return message

        async def send_closing_if_unread(message):
            # an answer before the body's end (a route that takes no body) closes the connection: the rest is
            # never read
            if message["type"] == "http.response.start" and body_left[0]:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive_in_time, send_closing_if_unread)


async def _http_error(request: Request, err: HTTPException) -> Response:
    return answer(err.status_code, {"error": f"{request.method} {request.url.path}: {err.detail}"}, close=True)


def make_app(state: VLLMServer, *, read_timeout: float = READ_TIMEOUT) -> FastAPI:
    """The routes over `state`, behind the Guard (no docs pages: every route but /prove/ needs the key)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    for route in ROUTES:
        app.add_api_route(route.path, _endpoint(state, route), methods=[route.method], include_in_schema=False)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(Guard, key=state.key, read_timeout=read_timeout)
    return app


# ---------------------------------------------------------------- connections
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
NO_ROOM = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


class Connection(H11Protocol):
    """uvicorn's h11 connection with what uvicorn lacks: a deadline for each request head (from the connection's
    start, or from the end of its last response) and a cap on open connections. A connection waiting for its head,
    or sending the body of a keyless request (/prove/), may be closed to make room; one that passed the key is not."""

    read_timeout = READ_TIMEOUT
    max_connections = MAX_CONNECTIONS
    keyless = frozenset(r.path for r in ROUTES if not r.keyed)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_deadline: asyncio.TimerHandle | None = None
        self.waiting_since: float | None = None  # set while this connection may be closed to make room
        self._wait_for_head()
        self._keep_under_cap()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        self.waiting_since = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.head_deadline is not None and self.conn.their_state is not h11.IDLE:  # a head came (or an error)
            self._cancel_head_deadline()
            path = self.scope["path"] if self.scope else ""
            if (path if path.endswith("/") else path + "/") not in self.keyless:
                self.waiting_since = None

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._wait_for_head()  # the next request's; an idle connection's keep-alive timer usually ends it first
        super().on_response_complete()

    def _wait_for_head(self) -> None:
        self._cancel_head_deadline()
        self.waiting_since = self.loop.time()
        self.head_deadline = self.loop.call_later(self.read_timeout, self._head_too_late)

    def _cancel_head_deadline(self) -> None:
        if getattr(self, "head_deadline", None) is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _head_too_late(self) -> None:
        self.head_deadline = None
        if not self.transport.is_closing():
            if self.conn.trailing_data[0]:  # part of a head came: say why it is dropped
                self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    def _keep_under_cap(self) -> None:
        open_now = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_now) <= self.max_connections:
            return
        waiting = [c for c in open_now if c is not self and getattr(c, "waiting_since", None) is not None]
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since)
            log.debug("vllm-serve: %d connections open: closing %s, waiting for its request the longest",
                      len(open_now), oldest.client)
            oldest.transport.abort()  # at once: nothing it waits for, and no flush it could stall
        else:  # every connection is serving a keyed request: this one waits its turn
            self.transport.write(NO_ROOM)
            self.transport.close()


def http_server(state: VLLMServer, host: str, port: int, *, read_timeout: float = READ_TIMEOUT,
                keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
                max_connections: int = MAX_CONNECTIONS) -> uvicorn.Server:
    """The server over `state` (not yet listening: `.run()` binds and serves until stopped)."""
    protocol = type("Connection", (Connection,), {"read_timeout": read_timeout, "max_connections": max_connections})
    config = uvicorn.Config(make_app(state, read_timeout=read_timeout), host=host, port=port, http=protocol,
                            ws="none", lifespan="off", timeout_keep_alive=keep_alive_timeout,
                            timeout_graceful_shutdown=5, log_config=None, log_level="warning", access_log=False,
                            server_header=False)
    return uvicorn.Server(config)


def fit_file_limit(max_connections: int) -> None:
    """Room for `max_connections` sockets beside the files the process holds (the engine's): the soft limit raised
    toward the hard one when short, else a refusal saying what to change."""
    import resource

    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: the limit is taken on trust
        return
    need = held + max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ValueError(f"--max-connections {max_connections}: this process holds {held} files and may open "
                             f"{hard} (ulimit -n); lower --max-connections to {max(1, hard - held - SPARE_FILES)} "
                             "or raise the limit")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def serve(adapter, *, host: str, port: int, max_model_len: int, seed: int, gpu_memory_utilization: float,
          kvcache_gb: float, device: torch.device, key: str, read_timeout: float = READ_TIMEOUT,
          keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
          max_lora_rank: int = 0, work_dir: str | None = None, tensor_parallel_size: int = 1) -> None:
    """Export `adapter`'s model (then released: the engine holds the weights), build the engine and serve until
    interrupted, answering only requests that carry `key`. `max_lora_rank` > 0: trainers may push LoRA adapters up to
    that rank instead of merged weights. `tensor_parallel_size` k: the engine runs in k worker processes (vLLM's own
    executor), which then take weights over the torch.distributed transport only."""
    import gc
    import tempfile
    from pathlib import Path

    import vllm
    from vllm import ModelRegistry

    from vlm_grpo.grpo.rollout.vllm.runtime import check_runnable
    from vlm_grpo.grpo.rollout.vllm.weights import export_model

    check_runnable(adapter, device, ModelRegistry.get_supported_archs())
    engine_thread = ThreadPoolExecutor(1, thread_name_prefix="vllm-engine")
    with tempfile.TemporaryDirectory(prefix="vllm-serve-", dir=work_dir) as tmp:
        export_model(adapter, Path(tmp) / "model")
        shapes = {spec.name: spec.shape for spec in PolicyWeights(adapter.model).specs()}
        architecture = architecture_of(adapter.model)
        adapter.model = None  # vLLM holds the weights from here on: not a second copy for as long as it serves
        gc.collect()
        llm = engine_thread.submit(build_llm, Path(tmp) / "model", max_model_len=max_model_len, seed=seed,
                                   gpu_memory_utilization=gpu_memory_utilization, kvcache_gb=kvcache_gb,
                                   on_cpu=device.type == "cpu", max_lora_rank=max_lora_rank,
                                   tensor_parallel_size=tensor_parallel_size).result()
        adapters = AdapterVersions(Path(tmp) / "adapters", remove_lora=llm.llm_engine.remove_lora) \
            if max_lora_rank else None
        state = VLLMServer(adapter.source or tmp, architecture, shapes, llm, key=key,
                           max_model_len=max_model_len, vllm_version=vllm.__version__, engine_thread=engine_thread,
                           adapters=adapters, max_lora_rank=max_lora_rank, group_host=host,
                           device="cuda" if device.type == "cuda" else "cpu", workers=tensor_parallel_size)
        fit_file_limit(max_connections)
        server = http_server(state, host, port, read_timeout=read_timeout, keep_alive_timeout=keep_alive_timeout,
                             max_connections=max_connections)
        print(f"vllm-serve: {state.info['architecture']} ({state.info['model']}) on http://{host}:{port}"
              + (f", LoRA adapters up to rank {max_lora_rank}" if max_lora_rank else "")
              + (f", {tensor_parallel_size} tensor-parallel workers" if tensor_parallel_size > 1 else ""), flush=True)
        try:
            server.run()
        finally:
            state.close()
