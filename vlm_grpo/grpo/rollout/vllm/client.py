"""The trainer's side of server mode: the handshake with a `vlm-grpo vllm-serve` server (server.py), then generate
and weight pushes over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from vlm_grpo.grpo.rollout.vllm import access
from vlm_grpo.grpo.rollout.vllm.access import HEADER, KEY_ENV
from vlm_grpo.grpo.rollout.vllm.engine import PROTOCOL, VLLMEngine
from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of
from vlm_grpo.grpo.rollout.vllm.server import ServerMismatch
from vlm_grpo.grpo.rollout.vllm.weights import model_signature
from vlm_grpo.grpo.rollout.vllm.wire import png, weights_bytes


class ServerEngine(VLLMEngine):
    """The trainer's side of server mode: the handshake at start, then generate and weight pushes over HTTP."""

    def __init__(self, adapter, cfg):
        super().__init__(adapter, cfg)
        r = cfg.rollout
        self.url = (r.vllm_server_base_url or f"http://{r.vllm_server_host}:{r.vllm_server_port}").rstrip("/")
        self.timeout = r.vllm_server_timeout
        self.key = access.client_key(r.vllm_server_key_file)
        if self.key is None:
            raise ValueError(f"rollout.vllm_mode server: the server's key is not given: set {KEY_ENV} (or "
                             "rollout.vllm_server_key_file) to the key `vlm-grpo vllm-serve` printed at start")
        self.handshake()

    def _call(self, route: str, data: bytes | None = None, content_type: str = "application/json") -> dict:
        request = urllib.request.Request(self.url + route, data=data, method="POST" if data is not None else "GET",
                                         headers={"Content-Type": content_type, HEADER: f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            detail = json.loads(err.read() or b"{}").get("error", err.reason)
            if err.code == 401:
                raise RuntimeError(f"the vLLM server at {self.url} refused the trainer's key: give the key the "
                                   f"server printed at start ({KEY_ENV} or rollout.vllm_server_key_file)") from None
            if err.code == 409:
                raise ServerMismatch(f"the vLLM server at {self.url} refused the trainer: {detail}") from None
            raise RuntimeError(f"the vLLM server at {self.url} failed {route}: {detail}") from None
        except urllib.error.URLError as err:
            raise RuntimeError(f"no vLLM server answers at {self.url} ({err.reason}): start one with "
                               "`vlm-grpo vllm-serve --model SAME_MODEL`, or set rollout.vllm_mode colocate") from None

    def handshake(self) -> None:
        info = self._call("/info/")
        mine = {"protocol": PROTOCOL, "architecture": architecture_of(self.adapter.model),
                "signature": model_signature(self.adapter.model)}
        for key, value in mine.items():
            if info.get(key) != value:
                raise ServerMismatch(
                    f"the vLLM server at {self.url} serves {info.get('architecture')} ({info.get('model')}, {key} "
                    f"{info.get(key)!r}), the trainer's model is {mine['architecture']} ({self.adapter.source}, "
                    f"{key} {value!r}): start the server with the trainer's --model")
        self.info = info

    def generate(self, reqs, options):
        body = {"requests": [{"prompt": r["prompt"],
                              "images": [png(im) for im in r.get("multi_modal_data", {}).get("image", [])]}
                             for r in reqs],
                "sampling": options}
        return self._call("/generate/", json.dumps(body).encode())["results"]

    def load_weights(self, items):
        self._call("/update_weights/", weights_bytes(items), content_type="application/octet-stream")
