"""Connections that never finish cannot starve the trainer: `vlm-grpo vllm-serve` drops a connection whose request
head is not whole within the read timeout, a body that stalls as long, an idle keep-alive connection, and keeps at
most `max_connections` open, closing the one that has waited longest for its head to make room (never one serving a
keyed request). The incident it answers: 129 half-open connections at a 128-file limit stalled the trainer."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.grpo.test_vllm_server_access import KEY, Running, StandInLLM, TinyPolicy, call, patch_generate, push, \
    stand_in_state, trainer
from vlm_grpo.grpo.rollout.vllm.weights import pushed_weights

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # seconds: generous, for a loaded 2-core machine; nothing here is timed


def closed_by_server(sock: socket.socket) -> bytes:
    """What the server sent before it closed `sock`; fails if it is still open after DEADLINE."""
    sock.settimeout(DEADLINE)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return data


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def connect(port: int, sent: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    if sent:
        sock.sendall(sent)
    return sock


@pytest.fixture()
def quick(monkeypatch):
    """A server with a 1 s read timeout and a 1 s keep-alive."""
    patch_generate(monkeypatch)
    running = Running(stand_in_state(), read_timeout=1.0, keep_alive_timeout=1.0)
    yield running
    running.stop()


# ---------------------------------------------------------------- timeouts
def test_a_half_sent_head_is_dropped(quick):
    silent = connect(quick.port)
    half = connect(quick.port, b"GET /health/ HTTP/1.1\r\nHost: x\r\nAuthoriz")
    assert closed_by_server(silent) == b""
    answer = closed_by_server(half)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")


def test_a_head_sent_byte_by_byte_gets_no_more_time(quick):
    """The deadline runs from the connection's start: trickling bytes does not move it."""
    sock = connect(quick.port)
    head = f"GET /health/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n".encode() * 50
    closed = False
    for i in range(len(head)):  # one byte every 50 ms: 30 s to send it all, were it let
        try:
            sock.sendall(head[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        if not still_open(sock):
            closed = True
            break
        time.sleep(0.05)
    assert closed
    assert not closed_by_server(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("head", [
    f"POST /generate/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n"
    '{"requests": ',
    "POST /prove/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"nonce\": ",
    f"POST /update_weights/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n"
    "100\r\nabc",
])
def test_a_stalled_body_is_dropped_with_408(quick, head):
    answer = closed_by_server(connect(quick.port, head.encode()))
    assert answer.startswith(b"HTTP/1.1 408") and b"stalled for 1 s" in answer, answer
    assert quick.state.llm.generated == [] and quick.state.llm.reloads == 0


def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_kept(quick):
    conn = http.client.HTTPConnection("127.0.0.1", quick.port, timeout=DEADLINE)
    for _ in range(3):  # one connection, three requests: keep-alive works, each head on a fresh deadline
        conn.request("GET", "/health/", headers={"Authorization": f"Bearer {KEY}"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
    assert closed_by_server(conn.sock) == b""  # then idle: closed
    conn.close()


# ---------------------------------------------------------------- the cap on connections
class BlockingLLM(StandInLLM):
    """generate waits until released: a keyed request in progress."""

    def __init__(self):
        super().__init__()
        self.release, self.started = threading.Event(), threading.Semaphore(0)

    def generate(self, reqs, params, use_tqdm=False, lora_request=None):
        self.started.release()
        assert self.release.wait(DEADLINE)
        return super().generate(reqs, params, lora_request=lora_request)


def test_past_the_cap_the_connection_waiting_longest_makes_room(monkeypatch):
    patch_generate(monkeypatch)
    running = Running(stand_in_state(), read_timeout=30.0, max_connections=4)  # only the cap closes them here
    try:
        idle = []
        for _ in range(6):
            idle.append(connect(running.port, b"GET /health/ HTTP/1.1\r\n"))
            assert call(running.url, "/health/")[0] == 200  # each one's arrival is seen before the next
        # each keyed call's connection, and the idle ones: the oldest idle ones made room
        assert [closed_by_server(s) for s in idle[:3]] == [b""] * 3
        assert [still_open(s) for s in idle[3:]] == [True] * 3
        assert call(running.url, "/info/")[1]["architecture"] == "Arch"
    finally:
        running.stop()


def test_a_keyed_request_in_progress_is_never_closed_to_make_room(monkeypatch):
    patch_generate(monkeypatch)
    llm = BlockingLLM()
    running = Running(stand_in_state(llm), read_timeout=30.0, max_connections=2)
    answers = []
    body = json.dumps({"requests": [{"prompt": "x"}]}).encode()
    busy = threading.Thread(target=lambda: answers.append(call(running.url, "/generate/", body)))
    try:
        busy.start()
        assert llm.started.acquire(timeout=DEADLINE)  # the keyed request is on the engine
        newcomers = [connect(running.port, b"GET /health/ HTTP/1.1\r\n") for _ in range(3)]
        # one waiting connection fits beside the busy one: each newcomer takes the place of the one before it
        assert [closed_by_server(s) for s in newcomers[:2]] == [b""] * 2 and still_open(newcomers[2])
        llm.release.set()
        busy.join(DEADLINE)
        assert answers == [(200, {"results": []})]
        for sock in newcomers:
            sock.close()
    finally:
        llm.release.set()
        running.stop()


def test_when_every_place_serves_a_keyed_request_a_newcomer_gets_503(monkeypatch):
    patch_generate(monkeypatch)
    llm = BlockingLLM()
    running = Running(stand_in_state(llm), read_timeout=30.0, max_connections=1)
    answers = []
    body = json.dumps({"requests": [{"prompt": "x"}]}).encode()
    busy = threading.Thread(target=lambda: answers.append(call(running.url, "/generate/", body)))
    try:
        busy.start()
        assert llm.started.acquire(timeout=DEADLINE)
        assert closed_by_server(connect(running.port)).startswith(b"HTTP/1.1 503")
        llm.release.set()
        busy.join(DEADLINE)
        assert answers == [(200, {"results": []})]
    finally:
        llm.release.set()
        running.stop()


# ---------------------------------------------------------------- the incident, at a 128-file limit
SERVER = """
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, hard), hard))
import vlm_grpo.grpo.rollout.vllm.server as server
from tests.grpo.test_vllm_server_access import Running, stand_in_state
server.llm_generate = lambda engine, reqs, options, lora_request=None: engine.generate(reqs, options) or []
running = Running(stand_in_state(), read_timeout=1.0, max_connections=64)
print(running.port, resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
sys.stdin.read()  # serves until the test closes stdin
running.stop()
"""


def test_half_open_connections_at_a_128_file_limit_do_not_stall_the_trainer(tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    sockets: list[socket.socket] = []
    try:
        port, limit = map(int, proc.stdout.readline().split())
        assert limit <= 128, "the server runs at the incident's file limit"
        for _ in range(150):  # more half-open connections than the server may open files
            sockets.append(connect(port, b"GET /health/ HTTP/1.1\r\nHost: x\r\nAuthor"))
        for head in [f"POST /generate/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 900\r\n"
                     "\r\n{", "POST /prove/ HTTP/1.1\r\nHost: x\r\nContent-Length: 90\r\n\r\n{"] * 2:  # bodies stall
            sockets.append(connect(port, head.encode()))
        engine = trainer(monkeypatch, f"http://127.0.0.1:{port}")  # the proof and the handshake
        assert engine.generate([{"prompt": "hi"}], {"n": 1}) == []
        push(engine, pushed_weights(TinyPolicy()))
        answers = [closed_by_server(s) for s in sockets]  # every one closed by the server, none left hanging
        assert all(a == b"" or a.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for a in answers), \
            {a[:40] for a in answers}
        assert proc.poll() is None
    finally:
        for s in sockets:
            s.close()
        proc.stdin.close()
        proc.wait(timeout=DEADLINE)
    text = log.read_text()
    assert "Too many open files" not in text and "Traceback" not in text, text[-3000:]


# ---------------------------------------------------------------- the flags, and room for the connections
def test_the_flags_and_their_defaults():
    from vlm_grpo.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["vllm-serve", "--model", "tiny:qwen2_5_vl"])
    assert (args.read_timeout, args.keep_alive_timeout, args.max_connections) == (30.0, 5.0, 64)
    args = parser.parse_args(["vllm-serve", "--model", "m", "--read-timeout", "1.5", "--max-connections", "8"])
    assert (args.read_timeout, args.max_connections) == (1.5, 8)
    for bad in (["--read-timeout", "0"], ["--read-timeout", "inf"], ["--max-connections", "0"],
                ["--keep-alive-timeout", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["vllm-serve", "--model", "m", *bad])


def test_the_file_limit_is_raised_to_fit_the_connections_or_the_start_refused(monkeypatch):
    import resource

    from vlm_grpo.grpo.rollout.vllm.server import fit_file_limit

    held = len(os.listdir("/proc/self/fd"))
    set_to = []
    monkeypatch.setattr(resource, "setrlimit", lambda kind, limits: set_to.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (held + 10, 100_000))
    fit_file_limit(64)
    assert len(set_to) == 1 and set_to[0][0] >= held + 64 and set_to[0][1] == 100_000
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (100, 120))
    with pytest.raises(ValueError, match=r"--max-connections 1000: .* may open 120 \(ulimit -n\); lower "
                                         r"--max-connections"):
        fit_file_limit(1000)
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (100_000, 100_000))
    set_to.clear()
    fit_file_limit(64)
    assert set_to == []  # room enough: left as it is
