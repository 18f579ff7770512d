"""What travels between the trainer's client and `vlm-grpo vllm-serve` (wire.py): /generate/ requests turned into
JSON and back into vLLM's own requests (prompt text or token ids, images, a video's frames and metadata), refused
with 400 naming the request and the field; the weights streamed frame by frame (chunked, one tensor at a time),
float32 and bf16 bit-exact; a cut, malformed or foreign push refused, and /generate/ refused after a push that
failed part-way until a whole one succeeds. Over HTTP on the real server with a stand-in engine."""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from tests.grpo.test_vllm_server_access import KEY, Running, TinyPolicy, call, patch_generate, push, \
    stand_in_state, trainer
from vlm_grpo.grpo.rollout.vllm import access, wire
from vlm_grpo.grpo.rollout.vllm.access import AccessError
from vlm_grpo.grpo.rollout.vllm.engine import PROTOCOL
from vlm_grpo.grpo.rollout.vllm.weights import model_signature, pushed_weights
from vlm_grpo.grpo.rollout.vllm.wire import ByteStream, ServerMismatch, native_requests, read_weights, request_json, \
    weight_frames


@pytest.fixture()
def running(monkeypatch):
    patch_generate(monkeypatch)
    server = Running(stand_in_state())
    yield server
    server.stop()


def _png(image) -> str:
    return wire.png(image)


IMAGE = Image.new("RGB", (7, 5), (10, 200, 30))
IMAGE.putpixel((0, 0), (1, 2, 3))
FRAMES = np.random.default_rng(0).integers(0, 256, (3, 4, 6, 3), dtype=np.uint8)
META = {"fps": 2.0, "duration": 1.5, "total_num_frames": 9, "frames_indices": [0, 4, 8], "video_backend": "pyav",
        "do_sample_frames": False}
NATIVE = [{"prompt": "a <image> b"},
          {"prompt_token_ids": [1, 2, 2**31 - 1], "multi_modal_data": {"image": [IMAGE]}},
          {"prompt": "v", "multi_modal_data": {"video": [(FRAMES, META)], "image": [IMAGE, IMAGE]}}]


def _check_native(back):
    assert back[0] == {"prompt": "a <image> b"}
    assert back[1]["prompt_token_ids"] == [1, 2, 2**31 - 1]
    assert np.array_equal(np.asarray(back[1]["multi_modal_data"]["image"][0]), np.asarray(IMAGE))
    assert len(back[2]["multi_modal_data"]["image"]) == 2
    frames, meta = back[2]["multi_modal_data"]["video"][0]
    assert isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.shape == (3, 4, 6, 3)
    assert np.array_equal(frames, FRAMES) and meta == META


# ---------------------------------------------------------------- /generate/ requests
def test_requests_travel_as_json_and_come_back_as_vllm_takes_them():
    sent = json.loads(json.dumps([request_json(r) for r in NATIVE]))
    assert set(sent[2]) == {"prompt", "images", "videos"} and len(sent[2]["videos"][0]["frames"]) == 3
    _check_native(native_requests(sent, max_model_len=16, max_requests=8))


def test_the_trainer_sends_native_requests_and_the_engine_gets_them_back(running, monkeypatch):
    engine = trainer(monkeypatch, running.url)
    assert engine.generate(NATIVE, {"n": 1}) == []
    reqs, options = running.state.llm.generated[0]
    _check_native(reqs)
    assert options == {"n": 1}


def test_the_lora_id_reaches_the_state(running):
    seen, generate = [], running.state.generate
    running.state.generate = lambda reqs, options, lora=None: seen.append(lora) or generate(reqs, options, lora)
    body = {"requests": [{"prompt": "x"}], "sampling": {}, "lora": None}
    assert call(running.url, "/generate/", json.dumps(body).encode()) == (200, {"results": []})
    status, answer = call(running.url, "/generate/", json.dumps({**body, "lora": 3}).encode())
    assert status == 409 and "runs without LoRA (vllm-serve --enable-lora)" in answer["error"]
    assert seen == [None, 3]


def _jpeg() -> str:
    buf = io.BytesIO()
    IMAGE.save(buf, format="JPEG")
    return base64.b64encode(buf.getvalue()).decode()


def _bomb() -> str:
    """A PNG of a few KiB whose header declares 81 M pixels."""
    buf = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


PNG = _png(IMAGE)
OTHER_SIZE = _png(Image.new("RGB", (3, 3)))


@pytest.mark.parametrize("bad, named", [
    ({"prompt": "a", "prompt_token_ids": [1]}, "request 1: one of prompt (text) or prompt_token_ids"),
    ({}, "request 1: one of prompt"),
    ({"prompt_token_ids": [1, -1]}, "request 1: prompt_token_ids must be 1 to 16 token ids"),
    ({"prompt_token_ids": [1, 2**31]}, "request 1: prompt_token_ids"),
    ({"prompt_token_ids": [1] * 17}, "request 1: prompt_token_ids must be 1 to 16"),
    ({"prompt_token_ids": [True]}, "request 1: prompt_token_ids"),
    ({"prompt_token_ids": []}, "request 1: prompt_token_ids"),
    ({"prompt": "a", "audio": []}, "request 1: fields 'audio' are not taken"),
    ({"prompt": "a", "images": ["not base64!"]}, "request 1: images[0]: not a readable PNG"),
    ({"prompt": "a", "images": [PNG, base64.b64encode(b"\x89PNG junk").decode()]}, "request 1: images[1]: not a "
                                                                                    "readable PNG"),
    ({"prompt": "a", "images": [_jpeg()]}, "request 1: images[0]: a JPEG image; PNG expected"),
    ({"prompt": "a", "images": [_bomb()]}, "request 1: images[0]: 9000x9000 pixels; at most"),
    ({"prompt": "a", "images": [PNG] * 65}, "request 1: images must be a list of at most 64"),
    ({"prompt": "a", "images": PNG}, "request 1: images must be a list"),
    ({"prompt": "a", "videos": [{"frames": [PNG, OTHER_SIZE]}]}, "request 1: videos[0]: frames of different sizes"),
    ({"prompt": "a", "videos": [{"frames": [PNG, 3]}]}, "request 1: videos[0]: frames[1]: a PNG as base64 text"),
    ({"prompt": "a", "videos": [{"frames": []}]}, "request 1: videos[0]: frames must be a list of 1 to 1024"),
    ({"prompt": "a", "videos": [{"frames": [OTHER_SIZE] * 1025}]}, "request 1: videos[0]: frames must be a list"),
    ({"prompt": "a", "videos": [{"frames": [PNG], "metadata": {"fps": -1}}]}, "request 1: videos[0]: metadata.fps=-1"),
    ({"prompt": "a", "videos": [{"frames": [PNG], "metadata": {"do_sample_frames": True}}]},
     "request 1: videos[0]: metadata.do_sample_frames=True"),
    ({"prompt": "a", "videos": [{"frames": [PNG], "metadata": {"frames_indices": [0, 1]}}]},
     "request 1: videos[0]: metadata.frames_indices"),
    ({"prompt": "a", "videos": [{"frames": [PNG], "metadata": {"codec": "h264"}}]},
     "request 1: videos[0]: metadata must be a mapping of fps"),
    ({"prompt": "a", "videos": [{"frames": [PNG], "sound": []}]}, "request 1: videos[0]: {frames"),
])
def test_a_bad_request_is_refused_naming_the_request_and_the_field(bad, named):
    with pytest.raises(AccessError) as refused:
        native_requests([{"prompt": "fine"}, bad], max_model_len=16, max_requests=8)
    assert refused.value.status == 400 and named in str(refused.value), str(refused.value)


def test_decoded_pixels_are_bounded_per_call(monkeypatch):
    monkeypatch.setattr(wire, "MAX_DECODED_BYTES", 7 * 5 * 3 * 2)  # two of IMAGE's size
    native_requests([{"prompt": "a", "images": [PNG, PNG]}], max_model_len=16, max_requests=8)
    with pytest.raises(AccessError, match=r"request 1: images\[0\]: the call's images and frames decode to more"):
        native_requests([{"prompt": "a", "images": [PNG, PNG]}, {"prompt": "b", "images": [PNG]}], max_model_len=16,
                        max_requests=8)


def test_a_bad_request_over_http_is_400_and_reaches_no_engine(running):
    body = {"requests": [{"prompt": "a"}, {"prompt": "b", "images": ["x"]}], "sampling": {}}
    status, answer = call(running.url, "/generate/", json.dumps(body).encode())
    assert status == 400 and "request 1: images[0]" in answer["error"]
    assert running.state.llm.generated == []


def test_the_client_refuses_what_the_wire_cannot_carry():
    with pytest.raises(ValueError, match=r"uint8 frames \[T, H, W, 3\]"):
        request_json({"prompt": "v", "multi_modal_data": {"video": [(FRAMES.astype(np.float32), META)]}})
    with pytest.raises(ValueError, match="do_sample_frames must be false"):
        request_json({"prompt": "v", "multi_modal_data": {"video": [(FRAMES, {**META, "do_sample_frames": True})]}})
    with pytest.raises(ValueError, match="images and videos only"):
        request_json({"prompt": "v", "multi_modal_data": {"audio": [b"x"]}})


# ---------------------------------------------------------------- /update_weights/: a stream of frames
def test_the_client_reads_one_tensor_at_a_time():
    pulled = []

    def tensors():
        for i in range(3):
            pulled.append(i)
            yield f"t{i}", torch.full((4,), float(i))

    frames = weight_frames(tensors())
    next(frames)  # the first tensor's header
    next(frames)  # its bytes
    assert pulled == [0]
    rest = list(frames)
    assert pulled == [0, 1, 2] and len(rest) == 5  # two frames per tensor left, then the end frame


def test_a_large_tensor_goes_in_bounded_chunks():
    chunks = list(weight_frames([("big", torch.zeros(3 * wire.SEND_CHUNK // 4 + 1))]))  # 3 chunks and 4 bytes
    assert [len(c) for c in chunks[1:-1]] == [wire.SEND_CHUNK] * 3 + [4]


def _read_all(data: bytes, check=None, piece: int = 7):
    """read_weights over `data` arriving in pieces of `piece` bytes."""

    async def chunks():
        for i in range(0, len(data), piece):
            yield data[i:i + piece]

    async def run():
        return [item async for item in read_weights(ByteStream(chunks()), check)]

    return asyncio.run(run())


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_frames_come_back_bit_exact_however_the_body_is_cut(piece):
    items = [("f32", torch.randn(3, 4)), ("bf16", torch.randn(5, 2).to(torch.bfloat16)),
             ("f16", torch.randn(3).half()), ("i64", torch.arange(6).reshape(2, 3)), ("scalar", torch.tensor(2.5)),
             ("empty", torch.zeros(0, 3)), ("mask", torch.tensor([True, False]))]
    back = _read_all(b"".join(weight_frames(items)), piece=piece)
    assert [n for n, _ in back] == [n for n, _ in items]
    for (_, a), (_, b) in zip(items, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _frame(header: dict) -> bytes:
    data = json.dumps(header).encode()
    return wire.FRAME_LENGTH.pack(len(data)) + data


GOOD = b"".join(weight_frames([("w", torch.zeros(2))]))
HEAD_W = _frame({"name": "w", "dtype": "float32", "shape": [2]})


@pytest.mark.parametrize("data, named", [
    (GOOD[:-3], "the body ended after 1 tensors, without its end frame"),
    (GOOD[:len(HEAD_W) + 3], "the body ended after 0 tensors"),
    (b"", "the body ended after 0 tensors"),
    (wire.FRAME_LENGTH.pack(10**9), "declares a 1000000000-byte header"),
    (wire.FRAME_LENGTH.pack(4) + b"\xff\xfe{}", "frame 0's header is not JSON"),
    (_frame({"name": "w", "dtype": "complex64", "shape": [2]}), "dtype 'complex64'"),
    (_frame({"name": "w", "dtype": "float32", "shape": [-2]}), "has shape [-2]"),
    (_frame({"name": "w", "dtype": "float32"}), "header must be {name, dtype, shape}"),
    (_frame([1, 2]), "frame 0's header is not a mapping"),
    (HEAD_W + bytes(8) + _frame({"end": True, "count": 2}), "does not close the 1 tensors sent"),
    (GOOD + b"x", "bytes after the end frame"),
])
def test_a_malformed_or_cut_stream_is_400(data, named):
    with pytest.raises(AccessError) as refused:
        _read_all(data)
    assert refused.value.status == 400 and named in str(refused.value), str(refused.value)


def test_the_check_runs_on_each_header_before_its_bytes():
    checked = []

    def check(name, shape):
        checked.append((name, shape))
        if name == "t1":
            raise AccessError(409, f"tensor {name!r}: not this model's")

    data = b"".join(weight_frames([("t0", torch.zeros(2)), ("t1", torch.zeros(3))]))
    with pytest.raises(AccessError, match="'t1'"):
        _read_all(data[:-20], check)  # t1's bytes are cut short: the check refused it before they were read
    assert checked == [("t0", (2,)), ("t1", (3,))]


def test_weights_stream_float32_and_bf16_exact_through_the_server(running, monkeypatch):
    engine = trainer(monkeypatch, running.url)
    policy = TinyPolicy(seed=1)  # other values, the same shapes
    sent = pushed_weights(policy)
    assert {t.dtype for _, t in sent} == {torch.float32, torch.bfloat16}
    push(engine, sent)
    loaded = running.state.llm.loaded
    assert [n for n, _ in loaded] == [n for n, _ in sent]
    for (_, a), (_, b) in zip(sent, loaded):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert engine.generate([{"prompt": "hi"}], {"n": 1}) == []


def _push_raw(port: int, chunks) -> tuple[int, dict]:
    """A push whose chunked body is `chunks` as given (cut short where a test cuts it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/update_weights/", body=iter(chunks), encode_chunked=True,
                     headers={"Authorization": f"Bearer {KEY}", "Transfer-Encoding": "chunked",
                              "Content-Type": "application/octet-stream"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_cut_push_is_400_and_generate_waits_for_a_whole_one(running, monkeypatch):
    engine = trainer(monkeypatch, running.url)
    chunks = list(weight_frames(pushed_weights(TinyPolicy())))
    status, answer = _push_raw(running.port, chunks[:2] + [chunks[2][:5]])  # the first tensor, then 5 bytes
    assert status == 400 and "ended after 1 tensors" in answer["error"] and "cut short" in answer["error"]
    status, answer = call(running.url, "/generate/", json.dumps({"requests": [{"prompt": "x"}]}).encode())
    assert status == 409 and "a weight push failed part-way" in answer["error"] and "push" in answer["error"]
    with pytest.raises(ServerMismatch, match="failed part-way"):
        engine.generate([{"prompt": "x"}], {})
    assert running.state.llm.generated == []
    push(engine, pushed_weights(TinyPolicy()))  # a whole push
    assert call(running.url, "/generate/", json.dumps({"requests": [{"prompt": "x"}]}).encode()) == \
        (200, {"results": []})


def test_a_tensor_the_model_lacks_is_409_before_the_engine_is_touched(running, monkeypatch):
    engine = trainer(monkeypatch, running.url)
    llm = running.state.llm
    for items, named in [([("vision.extra", torch.zeros(2))], "tensor 'vision.extra' is not a weight"),
                         ([("w", torch.zeros(3, 2))], "tensor 'w' has shape [3, 2]; this server's model has [2, 3]"),
                         ([], "the push holds none of the model's 2 tensors")]:
        status, answer = call(running.url, "/update_weights/", b"".join(weight_frames(items)),
                              content_type="application/octet-stream")
        assert status == 409 and named in answer["error"], answer
    # a large push refused at its first header: the server reads the rest, and the trainer gets the reason
    with pytest.raises(ServerMismatch, match="'unknown'"):
        push(engine, [("unknown", torch.zeros(8 * 2**20))])
    assert llm.reloads == 0
    assert engine.generate([{"prompt": "x"}], {}) == []  # the engine's weights are whole: it still generates


@pytest.mark.parametrize("items, named", [
    ([("w", torch.zeros(2, 3)), ("extra", torch.zeros(1))], "tensor 'extra' is not a weight"),
    ([("w", torch.zeros(2, 3))], "the push lacks 1 of the model's 2 tensors (first: 'b')"),
    ([("w", torch.zeros(2, 3)), ("w", torch.zeros(2, 3))], "tensor 'w' came twice"),
])
def test_a_push_refused_part_way_is_409_and_generate_waits(running, items, named):
    status, answer = call(running.url, "/update_weights/", b"".join(weight_frames(items)),
                          content_type="application/octet-stream")
    assert status == 409 and named in answer["error"], answer
    status, answer = call(running.url, "/generate/", json.dumps({"requests": [{"prompt": "x"}]}).encode())
    assert status == 409 and "failed part-way" in answer["error"]


class PushRecorder:
    """A stand-in server that proves the key and records how /update_weights/ arrives (headers, chunk sizes)."""

    def __init__(self, policy):
        info = {"protocol": PROTOCOL, "architecture": "Arch", "model": "m", "signature": model_signature(policy)}
        self.headers, self.chunk_sizes, self.body = {}, [], b""
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._send(info)

            def do_POST(self):  # noqa: N802
                if self.path == "/prove/":
                    nonce = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["nonce"]
                    return self._send({"proof": access.proof(KEY, nonce)})
                recorder.headers = dict(self.headers)
                while size := int(self.rfile.readline().strip(), 16):
                    recorder.chunk_sizes.append(size)
                    recorder.body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                self._send({"updated": 0})

            def _send(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_the_client_streams_chunked_without_a_length(monkeypatch):
    policy = TinyPolicy()
    recorder = PushRecorder(policy)
    try:
        engine = trainer(monkeypatch, recorder.url, policy=policy)
        big = [("w", torch.zeros(2, 3)), ("b", torch.zeros(5, dtype=torch.bfloat16)),
               ("big", torch.ones(wire.SEND_CHUNK // 2))]  # float32: two chunks of SEND_CHUNK bytes
        push(engine, big)
    finally:
        recorder.httpd.shutdown()
        recorder.httpd.server_close()
    headers = {k.lower(): v for k, v in recorder.headers.items()}
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert headers["authorization"] == f"Bearer {KEY}"  # sent only after the proof
    assert len(recorder.chunk_sizes) == 8 and max(recorder.chunk_sizes) == wire.SEND_CHUNK  # frame by frame
    back = _read_all(recorder.body)
    assert [n for n, _ in back] == ["w", "b", "big"] and torch.equal(back[2][1], big[2][1])


def test_a_whole_push_clears_the_servers_adapter(tmp_path):
    """A LoRA trainer pushes its base first and numbers its adapters from 1: after a whole push the server holds no
    adapter of the old base, and takes version 1 again (a resumed trainer, or a second one)."""
    from types import SimpleNamespace

    from vlm_grpo.grpo.rollout.vllm.lora_sync import AdapterVersions

    state = stand_in_state()
    state.adapters = AdapterVersions(tmp_path, request_class=lambda name, i, path: SimpleNamespace(lora_int_id=i,
                                                                                                   lora_path=path))
    state.max_lora_rank = 8
    matrix = [("base_model.model.w.lora_A.weight", torch.ones(2, 3))]
    for version in (1, 2):
        state.load_adapter(*state.check_adapter(version, {"r": 2}), matrix)
    with pytest.raises(AccessError, match="above the engine's 2"):
        state.check_adapter(1, {"r": 2})
    assert state.load_weights(pushed_weights(TinyPolicy())) == 2
    assert state.adapters.version == 0 and state.adapter_request(None) is None
    state.load_adapter(*state.check_adapter(1, {"r": 2}), matrix)
    assert state.adapter_request(1).lora_int_id == 1
    state.close()


def test_a_tensor_parallel_server_takes_no_http_push_and_the_trainer_is_told_first(monkeypatch):
    """An engine in several worker processes cannot take a streamed push (vLLM pickles a call's arguments to them):
    the route refuses it before the engine is touched, and a trainer on HTTP is refused at the handshake."""
    patch_generate(monkeypatch)
    state = stand_in_state()
    state.info["workers"] = 2
    running = Running(state)
    try:
        status, answer = call(running.url, "/update_weights/", b"".join(weight_frames(pushed_weights(TinyPolicy()))),
                              content_type="application/octet-stream")
        assert status == 409 and "runs in 2 worker processes" in answer["error"], answer
        assert state.llm.reloads == 0
        with pytest.raises(ValueError, match="rollout.vllm_weight_transport distributed"):
            trainer(monkeypatch, running.url)
    finally:
        running.stop()
