"""`vlm-grpo vllm-serve` answers only requests that carry its key (and proves it holds the key before the trainer
sends it), takes only the trainer's sampling options within limits, refuses key files others may read, and warns
when it listens beyond the loopback or a settings file points the trainer at another machine. Tested over HTTP on
the real FastAPI/uvicorn server with a stand-in engine (vLLM itself is not installed here)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import time
import types
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from vlm_grpo.grpo.rollout.vllm import access as vllm_access
from vlm_grpo.grpo.rollout.vllm.weights import pushed_weights
from vlm_grpo.grpo.rollout.vllm.wire import weight_frames

KEY = "k" * 20 + "-secret"


# ---------------------------------------------------------------- a stand-in engine and model (shared by the
# test_vllm_server_*.py files)
class StandInLLM:
    """What the server calls on vLLM's LLM, recorded; a weight push is consumed tensor by tensor as vLLM's
    worker.reload_weights would."""

    def __init__(self):
        self.generated, self.loaded, self.reloads, self.threads, self.lora_requests = [], [], 0, set(), []
        self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: None)

    def generate(self, reqs, params, use_tqdm=False, lora_request=None):
        self.threads.add(threading.current_thread().name)
        self.generated.append((reqs, params))
        self.lora_requests.append(lora_request)
        return []

    def collective_rpc(self, method, args=(), kwargs=None):
        self.threads.add(threading.current_thread().name)
        self.reloads += 1
        call = getattr(self, method) if isinstance(method, str) else lambda *a, **k: method(self, *a, **k)
        return [call(*args, **(kwargs or {}))]  # the stand-in is its own (one) worker

    def vlm_grpo_load(self, items):
        self.reload_weights(iter(items))
        return len(self.loaded)

    def reload_weights(self, weights_iterator):
        self.loaded = [(name, tensor.clone()) for name, tensor in weights_iterator]

    def reset_prefix_cache(self):
        self.threads.add(threading.current_thread().name)


class TinyPolicy(torch.nn.Module):
    """A policy of two tensors (float32 and bf16) whose checkpoint declares the architecture `Arch`."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(2, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(5, generator=g).to(torch.bfloat16))
        self.config = types.SimpleNamespace(architectures=["Arch"])


def specs_of(items) -> list:
    """The push plan of `items` (names, shapes, dtypes), as the trainer makes it before any tensor moves."""
    from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec

    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in items]


def push(engine, items) -> None:
    """`engine.load_weights` with the plan of `items`."""
    items = list(items)
    engine.load_weights(iter(items), specs_of(items))


def stand_in_state(llm=None, policy=None):
    from vlm_grpo.grpo.rollout.vllm.server import VLLMServer

    shapes = {name: tuple(t.shape) for name, t in pushed_weights(policy or TinyPolicy())}
    return VLLMServer("m", "Arch", shapes, llm or StandInLLM(), key=KEY, max_model_len=256, vllm_version="0")


def patch_generate(monkeypatch):
    """llm_generate without vLLM's SamplingParams: the options as they reach it."""
    import vlm_grpo.grpo.rollout.vllm.server as module

    monkeypatch.setattr(module, "llm_generate", lambda engine, reqs, options, lora_request=None:
                        engine.generate(reqs, options, lora_request=lora_request) or [])


class Running:
    """The real server over a state, serving from a thread; `.url`, `.stop()`."""

    def __init__(self, state, **limits):
        from vlm_grpo.grpo.rollout.vllm.server import http_server

        self.state = state
        self.server = http_server(state, "127.0.0.1", 0, **limits)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.state.close()


@pytest.fixture()
def server(monkeypatch):
    patch_generate(monkeypatch)
    running = Running(stand_in_state())
    yield running.url, running.state.llm
    running.stop()


def call(url, route, data=None, key=KEY, content_type="application/json"):
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + route, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def trainer(monkeypatch, url, policy=None):
    """The trainer's client (ServerEngine) for `url`, with the key in the environment."""
    from vlm_grpo.grpo.rollout.vllm.client import ServerEngine
    from vlm_grpo.grpo.settings.sections import TrainConfig

    monkeypatch.setenv(vllm_access.KEY_ENV, KEY)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_mode": "server", "vllm_server_base_url": url,
                               "vllm_server_timeout": 60.0})
    return ServerEngine(types.SimpleNamespace(model=policy or TinyPolicy(), source="m"), cfg)


def head_answer(port, head: bytes) -> bytes:
    """What the server answers to a request head sent alone (no body byte), read until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


GENERATE = json.dumps({"requests": [{"prompt": "x"}], "sampling": {"n": 1}}).encode()


# ---------------------------------------------------------------- the key
@pytest.mark.parametrize("key", [None, "", "k" * 20 + "-secreT", KEY + "x", "Basic " + KEY])
@pytest.mark.parametrize("route, body", [("/health/", None), ("/info/", None), ("/update_weights/", "weights"),
                                         ("/generate/", GENERATE), ("/reset_prefix_cache/", b"{}"),
                                         ("/no_such_route/", None)])
def test_every_route_refuses_a_request_without_the_key(server, key, route, body):
    url, llm = server
    data = b"".join(weight_frames(pushed_weights(TinyPolicy()))) if body == "weights" else body
    status, answer = call(url, route, data, key=key)
    assert status == 401 and "key" in answer["error"] and "model" not in answer
    assert llm.generated == [] and llm.reloads == 0


@pytest.mark.parametrize("route", ["/update_weights/", "/generate/", "/reset_prefix_cache/"])
@pytest.mark.parametrize("framing", [b"Content-Length: 100000000000\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_the_key_is_refused_before_the_body_is_read(server, route, framing):
    """A head that announces a huge body, and no body byte: the 401 comes at once, and the connection is closed."""
    url, llm = server
    port = int(url.rsplit(":", 1)[1])
    head = f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}x\r\n".encode() + framing + b"\r\n"
    answer = head_answer(port, head)
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()
    assert llm.generated == [] and llm.reloads == 0


def test_a_declared_body_over_the_route_limit_is_refused_before_it_is_read(server):
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    for route, size in [("/generate/", vllm_access.MAX_GENERATE_BYTES + 1), ("/prove/", 4097),
                        ("/reset_prefix_cache/", 10**9)]:
        head = (f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {size}\r\n\r\n"
                ).encode()
        answer = head_answer(port, head)
        assert answer.startswith(b"HTTP/1.1 413") and f"at most".encode() in answer, answer


def test_a_chunked_body_over_the_limit_is_refused(server):
    url, _ = server
    big = (b"x" * 1000 for _ in range(5))  # 5,000 bytes, chunked: no declared size to refuse up front
    status, answer = call(url, "/prove/", big, key=None)
    assert status == 413 and "more than 4096 bytes" in answer["error"]


def test_a_body_a_route_does_not_read_is_never_read(server):
    """/reset_prefix_cache/ takes no body: it answers, and closes the connection rather than reading an endless one."""
    url, llm = server
    port = int(url.rsplit(":", 1)[1])
    head = f"POST /reset_prefix_cache/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n" \
           "Transfer-Encoding: chunked\r\n\r\n400\r\n".encode() + b"x" * 1024 + b"\r\n"
    answer = head_answer(port, head)  # the body never ends: only the server's close ends this read
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()


def test_the_key_opens_every_route(server, monkeypatch):
    url, llm = server
    assert call(url, "/health/") == (200, {"status": "ok"})
    assert call(url, "/health") == (200, {"status": "ok"})  # without the slash, as before
    assert call(url, "/info/")[1]["architecture"] == "Arch"
    weights = pushed_weights(TinyPolicy())
    assert call(url, "/update_weights/", b"".join(weight_frames(weights)), content_type="application/octet-stream") \
        == (200, {"updated": 2})
    assert [n for n, _ in llm.loaded] == [n for n, _ in weights]
    body = {"requests": [{"prompt": "hi", "images": []}],
            "sampling": {"n": 4, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "min_tokens": 0,
                         "logprobs": 0, "prompt_logprobs": 5, "seed": 7, "stop_token_ids": [2], "detokenize": False,
                         "logit_bias": {"5": -100.0}},
            "lora": None}
    assert call(url, "/generate/", json.dumps(body).encode()) == (200, {"results": []})
    options = llm.generated[0][1]
    assert options["n"] == 4 and options["logit_bias"] == {5: -100.0} and options["prompt_logprobs"] == 5
    assert call(url, "/reset_prefix_cache/", b"{}") == (200, {"status": "ok"})
    # every engine call ran on the one engine thread, none on the event loop's
    assert llm.threads and all(name.startswith("vllm-engine") for name in llm.threads), llm.threads


# ---------------------------------------------------------------- what a request may ask
@pytest.mark.parametrize("sampling, named", [
    ({"n": 1e9}, "n=1000000000.0"), ({"n": 10**9}, "n=1000000000"), ({"n": True}, "n=True"),
    ({"max_tokens": 10**6}, "max_tokens"), ({"temperature": float("nan")}, "temperature"),
    ({"logprobs": 10**6}, "logprobs"), ({"prompt_logprobs": 21}, "prompt_logprobs=21"),
    ({"prompt_logprobs": -1}, "prompt_logprobs=-1"), ({"stop_token_ids": list(range(5000))}, "stop_token_ids"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"), ({"logit_bias": {"3": 1e9}}, "logit_bias"),
    ({"guided_decoding": {"regex": "a*"}}, "'guided_decoding'"), ({"output_kind": 1}, "'output_kind'"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"), ("n=3", "mapping"),
])
def test_sampling_options_are_an_allow_list_with_limits(server, sampling, named):
    url, llm = server
    body = {"requests": [{"prompt": "hi"}], "sampling": sampling}
    status, answer = call(url, "/generate/", json.dumps(body).encode())
    assert status == 400 and named in answer["error"], answer
    assert llm.generated == []


@pytest.mark.parametrize("body, named", [
    ({"requests": [{"prompt": "hi"}] * 1000, "sampling": {"n": 1000}}, "16384"),
    ({"requests": [{"prompt": 3}]}, "request 0: prompt"),
    ({"requests": []}, "1 to 1024"),
    ({"requests": [{"prompt": "a"}], "lora": -1}, "lora=-1"),
    ({"requests": [{"prompt": "a"}], "lora": "x"}, "lora=x"),
    ({"requests": [{"prompt": "a"}], "adapter": 1}, "{requests: [...], sampling"),
])
def test_many_prompts_times_n_are_capped_and_bad_bodies_are_400(server, body, named):
    url, llm = server
    status, answer = call(url, "/generate/", json.dumps(body).encode())
    assert status == 400 and named in answer["error"], answer
    assert call(url, "/generate/", b"not json")[0] == 400
    assert llm.generated == []


# ---------------------------------------------------------------- the proof: the server holds the key
@pytest.mark.parametrize("nonce", ["a" * 32, "Z9_-" * 64])
def test_the_server_proves_it_holds_the_key_without_being_given_it(server, nonce):
    url, _ = server
    status, answer = call(url, "/prove/", json.dumps({"nonce": nonce}).encode(), key=None)
    expected = hmac.new(KEY.encode(), b"vlm-grpo vllm-serve proof\x00" + nonce.encode(), hashlib.sha256).hexdigest()
    assert status == 200 and answer == {"proof": expected}


@pytest.mark.parametrize("body", [{"nonce": "a" * 31}, {"nonce": "a" * 257}, {"nonce": "a" * 31 + "/"},
                                  {"nonce": 12345}, {}, ["a" * 40]])
def test_a_bad_nonce_gets_no_proof(server, body):
    url, _ = server
    status, answer = call(url, "/prove/", json.dumps(body).encode(), key=None)
    assert status == 400 and "nonce" in answer["error"] and "proof" not in answer


def test_the_trainer_checks_the_proof_then_uses_its_key(server, monkeypatch):
    url, llm = server
    engine = trainer(monkeypatch, url)
    assert engine.proven and engine.info["architecture"] == "Arch"
    assert engine.generate([{"prompt": "hi"}], {"n": 2}) == []
    assert llm.generated[0][1] == {"n": 2}


class RecordingServer:
    """A server that is not vllm-serve: it records every request's headers and answers /prove/ as told
    (`proof(nonce)` -> the proof it sends, or None: 404)."""

    def __init__(self, proof):
        self.requests = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                recorder.requests.append((self.path, dict(self.headers)))
                self._send(200, {"status": "ok", "architecture": "Arch"})

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append((self.path, dict(self.headers)))
                answer = proof(json.loads(body)["nonce"]) if self.path == "/prove/" else None
                if answer is None:
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, {"proof": answer})

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _other_key_proof(nonce):
    return vllm_access.proof("another-key-of-20-chars", nonce)


@pytest.mark.parametrize("proof, reason", [
    (lambda nonce: None, "HTTP 404"),  # no /prove/ route: an older server, or another program on the port
    (lambda nonce: "0" * 64, "does not match"),
    (_other_key_proof, "does not match"),  # a server started with another key
    (lambda nonce: vllm_access.proof(KEY, "b" * 43), "does not match"),  # a proof replayed from another nonce
])
def test_a_server_without_the_proof_is_sent_nothing(monkeypatch, proof, reason):
    from vlm_grpo.grpo.rollout.vllm.client import ServerUnproven

    fake = RecordingServer(proof)
    try:
        with pytest.raises(ServerUnproven) as refused:
            trainer(monkeypatch, fake.url)
    finally:
        fake.stop()
    message = str(refused.value)
    assert fake.url in message and "nothing was sent to it (no key, no weights)" in message and reason in message
    assert "\n" not in message
    assert [path for path, _ in fake.requests] == ["/prove/"]  # the trainer sent nothing after the failed proof
    assert all(name.lower() != "authorization" for _, headers in fake.requests for name in headers)
    assert KEY not in json.dumps(fake.requests)


# ---------------------------------------------------------------- the key's sources
def test_the_key_sources_and_the_host_warning(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_access.KEY_ENV, raising=False)
    made, new = vllm_access.server_key(None)
    assert new and len(made) >= 32 and vllm_access.server_key(None)[0] != made  # a fresh key each start
    monkeypatch.setenv(vllm_access.KEY_ENV, KEY)
    assert vllm_access.server_key(None) == (KEY, False) and vllm_access.client_key(None) == KEY
    key_file = tmp_path / "key"
    key_file.write_text("short\n")
    key_file.chmod(0o600)
    with pytest.raises(ValueError, match="--api-key-file .*key: a key must be at least 16"):
        vllm_access.server_key(str(key_file))
    key_file.write_text(KEY + "\n")
    assert vllm_access.client_key(str(key_file)) == KEY and vllm_access.server_key(str(key_file)) == (KEY, False)
    assert vllm_access.authorized(f"Bearer {KEY}", KEY) and not vllm_access.authorized(f"Bearer {KEY[:-1]}", KEY)
    assert vllm_access.exposure_warning("127.0.0.1") is None and vllm_access.exposure_warning("::1") is None
    assert vllm_access.exposure_warning("localhost") is None
    assert "not on the loopback" in vllm_access.exposure_warning("0.0.0.0")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_key_file_others_may_read_or_change_is_refused(tmp_path, mode):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(mode)
    for read, what in [(lambda: vllm_access.server_key(str(key_file)), "--api-key-file"),
                       (lambda: vllm_access.client_key(str(key_file)), "rollout.vllm_server_key_file")]:
        with pytest.raises(ValueError) as refused:
            read()
        assert f"{what} {key_file}" in str(refused.value) and f"chmod 600 {key_file}" in str(refused.value)
        assert f"{mode:04o}" in str(refused.value)
    key_file.chmod(0o400)  # the owner's alone, read-only: fine
    assert vllm_access.client_key(str(key_file)) == KEY


def test_the_trainer_needs_the_key(monkeypatch):
    from vlm_grpo.grpo.rollout.vllm.client import ServerEngine
    from vlm_grpo.grpo.settings.sections import TrainConfig

    monkeypatch.delenv(vllm_access.KEY_ENV, raising=False)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_mode": "server"})
    with pytest.raises(ValueError, match="VLM_GRPO_VLLM_KEY"):
        ServerEngine(type("A", (), {"model": None})(), cfg)


def test_the_client_imports_without_the_server_stack():
    import subprocess
    import sys

    code = ("import sys, vlm_grpo.grpo.rollout.vllm.client, vlm_grpo.grpo.rollout.vllm.modes; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn', 'starlette')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


# ---------------------------------------------------------------- a settings file pointing at another machine
SERVER_MODE = "rollout:\n  engine: vllm\n  vllm_mode: server\n"


@pytest.mark.parametrize("in_file, words, warns", [
    ("  vllm_server_base_url: http://10.9.8.7:8000\n", [], "10.9.8.7"),
    ("  vllm_server_host: 10.9.8.7\n", [], "10.9.8.7"),
    ("  vllm_server_base_url: http://127.0.0.1:8000\n", [], None),
    ("  vllm_server_host: localhost\n", [], None),
    ("", ["--vllm_server_base_url", "http://10.9.8.7:8000"], None),  # the user's own command line
    ("  vllm_server_host: 10.9.8.7\n", ["--vllm_server_host", "10.9.8.6"], None),  # the file's value is not used
])
def test_a_settings_file_that_sends_the_key_to_another_machine_is_named(tmp_path, capsys, in_file, words, warns):
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    config = tmp_path / "run.yaml"
    config.write_text(SERVER_MODE + in_file)
    load_recipe_config(config, words)
    err = capsys.readouterr().err
    if warns is None:
        assert "warning" not in err, err
    else:
        line = [ln for ln in err.splitlines() if "warning" in ln]
        assert len(line) == 1 and str(config) in line[0] and warns in line[0], err
        assert "will send its vLLM server key and the policy's weights" in line[0]


def test_a_remote_address_on_the_command_line_or_outside_server_mode_does_not_warn(tmp_path, capsys):
    from vlm_grpo.grpo.settings.sources import load_config

    config = tmp_path / "run.yaml"
    config.write_text("rollout:\n  engine: vllm\n  vllm_mode: colocate\n  vllm_server_host: 10.9.8.7\n")
    load_config(config)  # colocate: the host is not used
    load_config(None, ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_host", "10.9.8.7"])
    assert "warning" not in capsys.readouterr().err
    config.write_text(SERVER_MODE + "  vllm_server_host: 10.9.8.7\n")
    load_config(config)
    assert f"warning: {config} sets rollout.vllm_server_host 10.9.8.7" in capsys.readouterr().err
