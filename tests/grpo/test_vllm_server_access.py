"""`vlm-grpo vllm-serve` answers only requests that carry its key, takes only the trainer's sampling options within
limits, and warns when it listens beyond the loopback. Tested at the HTTP layer with a stand-in engine (vLLM itself
is not installed here)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

from vlm_grpo.grpo.rollout.vllm import access as vllm_access
from vlm_grpo.grpo.rollout.vllm.server import VLLMServer, http_server
from vlm_grpo.grpo.rollout.vllm.weights import signature
from vlm_grpo.grpo.rollout.vllm.wire import weights_bytes

KEY = "k" * 20 + "-secret"
WEIGHTS = [("w", torch.zeros(2, 3))]


class StandInLLM:
    """What the server calls on vLLM's LLM, recorded."""

    def __init__(self):
        self.generated, self.loaded = [], []

    def generate(self, reqs, params, use_tqdm=False):
        self.generated.append((reqs, params))
        return []

    def collective_rpc(self, fn):
        self.loaded.append(fn)

    def reset_prefix_cache(self):
        pass


@pytest.fixture()
def server(monkeypatch):
    import vlm_grpo.grpo.rollout.vllm.server as module

    llm = StandInLLM()
    monkeypatch.setattr(module, "llm_generate", lambda engine, reqs, options: engine.generate(reqs, options) or [])
    monkeypatch.setattr(module, "llm_load_weights", lambda engine, items: engine.collective_rpc(items))
    state = VLLMServer("m", "Arch", signature("Arch", [("w", (2, 3))]), llm, key=KEY, max_model_len=256,
                       vllm_version="0")
    httpd = http_server(state, "127.0.0.1", 0)
    # a short poll: shutdown() waits up to one poll interval (0.5 s by default, per test)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", llm
    httpd.shutdown()
    httpd.server_close()


def _call(url, route, data=None, key=KEY, content_type="application/json"):
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + route, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.mark.parametrize("key", [None, "", "k" * 20 + "-secreT", KEY + "x", "Basic " + KEY])
@pytest.mark.parametrize("route, body", [("/health/", None), ("/info/", None), ("/update_weights/", "weights"),
                                         ("/generate/", "generate"), ("/reset_prefix_cache/", b"{}")])
def test_every_route_refuses_a_request_without_the_key(server, key, route, body):
    url, llm = server
    data = weights_bytes(WEIGHTS) if body == "weights" else json.dumps(
        {"requests": [{"prompt": "x"}], "sampling": {"n": 1}}).encode() if body == "generate" else body
    status, answer = _call(url, route, data, key=key)
    assert status == 401 and "key" in answer["error"] and "model" not in answer
    assert llm.generated == [] and llm.loaded == []


def test_the_key_opens_every_route(server):
    url, llm = server
    assert _call(url, "/health/") == (200, {"status": "ok"})
    assert _call(url, "/info/")[1]["architecture"] == "Arch"
    assert _call(url, "/update_weights/", weights_bytes(WEIGHTS), content_type="application/octet-stream") == (
        200, {"updated": 1})
    body = {"requests": [{"prompt": "hi", "images": []}],
            "sampling": {"n": 4, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "min_tokens": 0,
                         "logprobs": 0, "seed": 7, "stop_token_ids": [2], "detokenize": False,
                         "logit_bias": {"5": -100.0}}}
    assert _call(url, "/generate/", json.dumps(body).encode()) == (200, {"results": []})
    options = llm.generated[0][1]
    assert options["n"] == 4 and options["logit_bias"] == {5: -100.0}


@pytest.mark.parametrize("sampling, named", [
    ({"n": 1e9}, "n=1000000000.0"), ({"n": 10**9}, "n=1000000000"), ({"n": True}, "n=True"),
    ({"max_tokens": 10**6}, "max_tokens"), ({"temperature": float("nan")}, "temperature"),
    ({"logprobs": 10**6}, "logprobs"), ({"stop_token_ids": list(range(5000))}, "stop_token_ids"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"), ({"logit_bias": {"3": 1e9}}, "logit_bias"),
    ({"guided_decoding": {"regex": "a*"}}, "'guided_decoding'"), ({"output_kind": 1}, "'output_kind'"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"), ("n=3", "mapping"),
])
def test_sampling_options_are_an_allow_list_with_limits(server, sampling, named):
    url, llm = server
    body = {"requests": [{"prompt": "hi"}], "sampling": sampling}
    status, answer = _call(url, "/generate/", json.dumps(body).encode())
    assert status == 400 and named in answer["error"], answer
    assert llm.generated == []


def test_many_prompts_times_n_are_capped_and_bad_bodies_are_400(server):
    url, llm = server
    body = {"requests": [{"prompt": "hi"}] * 1000, "sampling": {"n": 1000}}
    assert _call(url, "/generate/", json.dumps(body).encode())[0] == 400
    assert _call(url, "/generate/", b"not json")[0] == 400
    assert _call(url, "/generate/", json.dumps({"requests": [{"prompt": 3}]}).encode())[0] == 400
    assert llm.generated == []


def test_the_key_sources_and_the_host_warning(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_access.KEY_ENV, raising=False)
    made, new = vllm_access.server_key(None)
    assert new and len(made) >= 32 and vllm_access.server_key(None)[0] != made  # a fresh key each start
    monkeypatch.setenv(vllm_access.KEY_ENV, KEY)
    assert vllm_access.server_key(None) == (KEY, False) and vllm_access.client_key(None) == KEY
    (tmp_path / "key").write_text("short\n")
    with pytest.raises(ValueError, match="--api-key-file .*key: a key must be at least 16"):
        vllm_access.server_key(str(tmp_path / "key"))
    (tmp_path / "key").write_text(KEY + "\n")
    assert vllm_access.client_key(str(tmp_path / "key")) == KEY
    assert vllm_access.authorized(f"Bearer {KEY}", KEY) and not vllm_access.authorized(f"Bearer {KEY[:-1]}", KEY)
    assert vllm_access.exposure_warning("127.0.0.1") is None and vllm_access.exposure_warning("::1") is None
    assert vllm_access.exposure_warning("localhost") is None
    assert "not on the loopback" in vllm_access.exposure_warning("0.0.0.0")


def test_the_trainer_needs_the_key(monkeypatch):
    from vlm_grpo.grpo.rollout.vllm.client import ServerEngine
    from vlm_grpo.grpo.settings.sections import TrainConfig

    monkeypatch.delenv(vllm_access.KEY_ENV, raising=False)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_mode": "server"})
    with pytest.raises(ValueError, match="VLM_GRPO_VLLM_KEY"):
        ServerEngine(type("A", (), {"model": None})(), cfg)
