"""vLLM in its own process: `vlm-grpo vllm-serve --model SPEC`, the server.

A small HTTP server on the loopback (stdlib, one request at a time) wrapping one `LLM`; routes named as TRL's
trl/scripts/vllm_serve.py where they do the same. Every request carries the server's key (access.py: 401
without it, before the body is read); a request's sampling options are checked against an allow-list (400):

- GET  /health/            -> 200 once the engine is built
- GET  /info/              -> the handshake: protocol, vlm-grpo and vLLM versions, architecture, weight signature
- POST /generate/          -> JSON {requests: [{prompt, images: [PNG base64]}], sampling: {...}} -> results
- POST /update_weights/    -> the policy's weights as safetensors bytes (works on CPU and GPU: no NCCL group)
- POST /reset_prefix_cache/

The trainer (client.py) refuses a server whose model or protocol differs from the trainer's (the handshake), naming both.
"""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from vlm_grpo.grpo.rollout.vllm import access
from vlm_grpo.grpo.rollout.vllm.access import HEADER, KEY_ENV, AccessError
from vlm_grpo.grpo.rollout.vllm.engine import PROTOCOL
from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of, build_llm, llm_generate, llm_load_weights
from vlm_grpo.grpo.rollout.vllm.weights import model_signature, signature
from vlm_grpo.grpo.rollout.vllm.wire import image_from_png, weights_from_bytes

log = logging.getLogger(__name__)


class ServerMismatch(RuntimeError):
    """The server runs another model (or protocol) than the trainer's."""


# ---------------------------------------------------------------- the server
class VLLMServer:
    """One engine over one model directory, and what it answers."""

    def __init__(self, model_dir: str, architecture: str, weights_signature: str, llm, *, key: str,
                 max_model_len: int, vllm_version: str):
        from vlm_grpo.version import __version__

        self.llm, self.key, self.max_model_len = llm, key, max_model_len
        self.info = {"protocol": PROTOCOL, "vlm_grpo": __version__, "vllm": vllm_version, "model": model_dir,
                     "architecture": architecture, "signature": weights_signature}

    def generate(self, body: dict) -> dict:
        checked = access.checked_requests(body)
        options = access.checked_sampling(body.get("sampling", {}), max_model_len=self.max_model_len,
                                               requests=len(checked))
        reqs = []
        for r in checked:
            req: dict[str, Any] = {"prompt": r["prompt"]}
            if r.get("images"):
                req["multi_modal_data"] = {"image": [image_from_png(x) for x in r["images"]]}
            reqs.append(req)
        return {"results": llm_generate(self.llm, reqs, options)}

    def update_weights(self, data: bytes) -> dict:
        items = weights_from_bytes(data)
        got = signature(self.info["architecture"], ((n, tuple(t.shape)) for n, t in items))
        if got != self.info["signature"]:
            raise ServerMismatch(f"weights of signature {got}; this server's model is {self.info['signature']}")
        llm_load_weights(self.llm, items)
        return {"updated": len(items)}


def _handler(server: VLLMServer):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _allowed(self) -> bool:
            """Every route, /health/ included, answers only a request that carries the key."""
            if access.authorized(self.headers.get(HEADER), server.key):
                return True
            self.close_connection = True  # the body (maybe weights) is never read
            self._send(401, {"error": f"this server needs its key: send `{HEADER}: Bearer KEY` (the trainer reads "
                                      f"it from {KEY_ENV} or rollout.vllm_server_key_file)"})
            return False

        def do_GET(self):  # noqa: N802 (http.server's name)
            if not self._allowed():
                return None
            if self.path.rstrip("/") == "/health":
                return self._send(200, {"status": "ok"})
            if self.path.rstrip("/") == "/info":
                return self._send(200, server.info)
            return self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):  # noqa: N802
            if not self._allowed():
                return None
            route = self.path.rstrip("/")
            try:
                size = int(self.headers.get("Content-Length", 0))
            except ValueError:
                size = -1
            if size < 0 or (route == "/generate" and size > access.MAX_GENERATE_BYTES):
                self.close_connection = True
                return self._send(413 if size > 0 else 400, {"error": f"Content-Length {size}: at most "
                                                             f"{access.MAX_GENERATE_BYTES} bytes"})
            body = self.rfile.read(size)
            try:
                if route == "/generate":
                    return self._send(200, server.generate(json.loads(body)))
                if route == "/update_weights":
                    return self._send(200, server.update_weights(body))
                if route == "/reset_prefix_cache":
                    server.llm.reset_prefix_cache()
                    return self._send(200, {"status": "ok"})
            except ServerMismatch as err:
                return self._send(409, {"error": str(err)})
            except AccessError as err:
                return self._send(err.status, {"error": str(err)})
            except ValueError as err:  # a body that is no JSON, or weights that are no safetensors
                return self._send(400, {"error": f"{type(err).__name__}: {err}"[:500]})
            except Exception as err:  # the trainer gets the reason in one line; the server keeps serving
                log.exception("vllm-serve: %s failed", route)
                return self._send(500, {"error": f"{type(err).__name__}: {err}"})
            return self._send(404, {"error": f"no route {self.path}"})

        def log_message(self, fmt, *args):  # one line per request at debug level, not on stderr
            log.debug(fmt, *args)

    return Handler


def http_server(state: VLLMServer, host: str, port: int) -> ThreadingHTTPServer:
    """The listening server over `state` (not yet serving)."""
    httpd = ThreadingHTTPServer((host, port), _handler(state))
    httpd.daemon_threads = True
    return httpd


def serve(adapter, *, host: str, port: int, max_model_len: int, seed: int, gpu_memory_utilization: float,
          kvcache_gb: float, device: torch.device, key: str, work_dir: str | None = None, ready=None) -> None:
    """Export `adapter`'s model, build the engine and serve until interrupted, answering only requests that carry
    `key`. `ready(server)`: called once listening (tests)."""
    import tempfile

    import vllm
    from vllm import ModelRegistry

    from vlm_grpo.grpo.rollout.vllm.runtime import check_runnable
    from vlm_grpo.grpo.rollout.vllm.weights import export_model

    check_runnable(adapter, device, ModelRegistry.get_supported_archs())
    with tempfile.TemporaryDirectory(prefix="vllm-serve-", dir=work_dir) as tmp:
        export_model(adapter, tmp)
        llm = build_llm(tmp, max_model_len=max_model_len, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                        kvcache_gb=kvcache_gb, on_cpu=device.type == "cpu")
        state = VLLMServer(adapter.source or tmp, architecture_of(adapter.model), model_signature(adapter.model), llm,
                           key=key, max_model_len=max_model_len, vllm_version=vllm.__version__)
        httpd = http_server(state, host, port)
        print(f"vllm-serve: {state.info['architecture']} ({state.info['model']}) on http://{host}:{port}", flush=True)
        if ready is not None:
            ready(httpd)
        try:
            httpd.serve_forever()
        finally:
            httpd.server_close()
