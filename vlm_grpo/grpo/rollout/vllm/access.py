"""Who may use a `vlm-grpo vllm-serve` server, and what they may ask of it.

The server takes weights and runs sampling for whoever reaches its port, so every request must carry its key
(`Authorization: Bearer KEY`, vLLM's own `--api-key` convention), compared in constant time. The key is given to
the server (`--api-key-file`, or VLM_GRPO_VLLM_KEY) or made at start and printed once; the trainer reads it from
VLM_GRPO_VLLM_KEY or `rollout.vllm_server_key_file` (never a setting's value: settings are saved with the run).
A web page cannot send that header to another origin without the server's consent (CORS), so a page the user opens
reaches nothing either.

A request's sampling options are an allow-list with limits (what the trainer sends, `requests.sampling_options`),
never handed to vLLM's SamplingParams unchecked: `n: 1e9` or an unknown keyword is refused with 400, naming it.

Before the trainer sends anything keyed, the server proves it holds the key: the trainer's random nonce, answered
with HMAC-SHA256(key, PROOF_TAG + nonce) on the one route that needs no key (/prove/). A server that cannot answer
(another program on the port, a host a settings file pointed at) never sees the key or the weights. A key file
others may read is refused, as ssh refuses such a private key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import re
import secrets
import socket
import stat
from pathlib import Path
from typing import Any

KEY_ENV = "VLM_GRPO_VLLM_KEY"
HEADER = "Authorization"
MIN_KEY_CHARS = 16
MAX_REQUESTS = 1024  # prompts in one /generate/ call
MAX_COMPLETIONS = 16_384  # prompts x n in one call
MAX_GENERATE_BYTES = 256 * 2**20  # a /generate/ body (prompts and PNG images)
MAX_BIAS_ENTRIES = 4096
MAX_STOP_IDS = 1024
PROOF_TAG = b"vlm-grpo vllm-serve proof\x00"  # what the server signs: its key proves nothing for another protocol
NONCE = re.compile(r"[A-Za-z0-9_-]{32,256}")  # url-safe, as secrets.token_urlsafe makes it


class AccessError(ValueError):
    """A request the server refuses: `status` is its HTTP code."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


# ---------------------------------------------------------------- the key
def new_key() -> str:
    return secrets.token_urlsafe(32)


def read_key_file(path: str | Path, what: str) -> str:
    """The key in `path`; refused when others than its owner may read or change the file."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode) and mode & 0o077:
            raise ValueError(f"{what} {path}: group or others may read or change it (mode "
                             f"{stat.S_IMODE(mode):04o}); a key file must be its owner's alone: `chmod 600 {path}`")
        key = Path(path).read_text().strip()
    except OSError as err:
        raise ValueError(f"{what} {path}: cannot read it ({err.strerror or err})") from None
    return checked_key(key, f"{what} {path}")


def checked_key(key: str, where: str) -> str:
    if len(key) < MIN_KEY_CHARS or any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ValueError(f"{where}: a key must be at least {MIN_KEY_CHARS} printable characters without spaces")
    return key


def server_key(key_file: str | None) -> tuple[str, bool]:
    """(the server's key, whether it was made now): from `key_file`, else VLM_GRPO_VLLM_KEY, else a new one."""
    if key_file:
        return read_key_file(key_file, "--api-key-file"), False
    if os.environ.get(KEY_ENV):
        return checked_key(os.environ[KEY_ENV], KEY_ENV), False
    return new_key(), True


def client_key(key_file: str | None) -> str | None:
    """The trainer's key: `rollout.vllm_server_key_file`, else VLM_GRPO_VLLM_KEY (None: none given)."""
    if key_file:
        return read_key_file(key_file, "rollout.vllm_server_key_file")
    return os.environ.get(KEY_ENV) or None


def authorized(header: str | None, key: str) -> bool:
    """Whether a request's Authorization header carries `key` (constant time: no timing says how much matched)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), key.encode())


def new_nonce() -> str:
    return secrets.token_urlsafe(32)


def checked_nonce(value: object) -> str:
    if not isinstance(value, str) or not NONCE.fullmatch(value):
        raise AccessError(400, "nonce: 32 to 256 url-safe characters (A-Z a-z 0-9 _ -) expected")
    return value


def proof(key: str, nonce: str) -> str:
    """What a server holding `key` answers to `nonce` (hex HMAC-SHA256 over PROOF_TAG + nonce)."""
    return hmac.new(key.encode(), PROOF_TAG + nonce.encode(), hashlib.sha256).hexdigest()


def proves(answer: object, key: str, nonce: str) -> bool:
    """Whether `answer` is the proof of `key` for `nonce` (constant time)."""
    return isinstance(answer, str) and hmac.compare_digest(answer.encode("utf-8", "replace"),
                                                           proof(key, nonce).encode())


def is_loopback(host: str) -> bool:
    """Whether `host` listens on this machine only."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def exposure_warning(host: str) -> str | None:
    if is_loopback(host):
        return None
    return (f"warning: vllm-serve listens on {host}, not on the loopback: every machine that reaches this port can "
            "try the key, and the key and the weights travel unencrypted over HTTP; keep the port behind a firewall "
            "or an SSH tunnel (docs/vllm.md)")


def settings_host_warning(source: str | Path, setting: str, value: str, host: str) -> str | None:
    """A server address a settings FILE gave (not the command line), when it is not this machine's loopback."""
    if is_loopback(host):
        return None
    return (f"warning: {source} sets {setting} {value}: the trainer will send its vLLM server key and the policy's "
            f"weights to {host}, another machine than this one; if that is not your server, remove it from the file "
            "(a server you start yourself can be given on the command line)")


# ---------------------------------------------------------------- what a request may ask
def _int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AccessError(400, f"sampling option {name}={value!r}: an integer from {low} to {high}")
    return value


def _float(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise AccessError(400, f"sampling option {name}={value!r}: a number from {low} to {high}")
    return float(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise AccessError(400, f"sampling option {name}={value!r}: true or false")
    return value


def checked_sampling(options: Any, *, max_model_len: int, requests: int) -> dict[str, Any] | list[dict[str, Any]]:
    """The call's sampling options as SamplingParams may take them: only the trainer's keys, each in range; one
    mapping for every prompt, or a list of one per prompt (a tool turn: each row its own seed and budget)."""
    if isinstance(options, list):
        if len(options) != requests:
            raise AccessError(400, f"sampling: {len(options)} option sets for {requests} prompts (one each, or one "
                              "mapping for all)")
        out = [_checked_options(o, max_model_len) for o in options]
        if sum(o.get("n", 1) for o in out) > MAX_COMPLETIONS:
            raise AccessError(400, f"{sum(o.get('n', 1) for o in out)} completions in one call: at most "
                              f"{MAX_COMPLETIONS}")
        return out
    out = _checked_options(options, max_model_len)
    if requests * out.get("n", 1) > MAX_COMPLETIONS:
        raise AccessError(400, f"{requests} prompts x n={out.get('n', 1)} completions: at most {MAX_COMPLETIONS} "
                          "per call")
    return out


def _checked_options(options: Any, max_model_len: int) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise AccessError(400, "sampling must be a mapping of options (or a list of one per prompt)")
    rules = {
        "n": lambda v: _int("n", v, 1, 1024),
        "temperature": lambda v: _float("temperature", v, 0.0, 100.0),
        "top_p": lambda v: _float("top_p", v, 1e-6, 1.0),
        "top_k": lambda v: _int("top_k", v, -1, 2**31 - 1),
        "max_tokens": lambda v: _int("max_tokens", v, 1, max_model_len),
        "min_tokens": lambda v: _int("min_tokens", v, 0, max_model_len),
        "logprobs": lambda v: None if v is None else _int("logprobs", v, 0, 20),
        "prompt_logprobs": lambda v: None if v is None else _int("prompt_logprobs", v, 0, 20),
        "seed": lambda v: None if v is None else _int("seed", v, -(2**63), 2**63 - 1),
        "detokenize": lambda v: _bool("detokenize", v),
        "stop_token_ids": _stop_ids,
        "logit_bias": _bias,
    }
    unknown = sorted(set(options) - set(rules))
    if unknown:
        raise AccessError(400, f"sampling options {', '.join(map(repr, unknown))[:200]} are not taken (allowed: "
                          f"{', '.join(rules)})")
    out = {name: rules[name](value) for name, value in options.items()}
    if out.get("min_tokens", 0) > out.get("max_tokens", max_model_len):
        raise AccessError(400, f"sampling option min_tokens={out['min_tokens']} is above max_tokens={out['max_tokens']}")
    return out


def _stop_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_STOP_IDS:
        raise AccessError(400, f"sampling option stop_token_ids: a list of at most {MAX_STOP_IDS} token ids")
    return [_int("stop_token_ids", v, 0, 2**31 - 1) for v in value]


def _bias(value: Any) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_BIAS_ENTRIES:
        raise AccessError(400, f"sampling option logit_bias: a mapping of at most {MAX_BIAS_ENTRIES} token ids")
    out = {}
    for k, v in value.items():
        try:
            token = int(k)
        except (TypeError, ValueError):
            raise AccessError(400, f"sampling option logit_bias: {str(k)[:40]!r} is not a token id") from None
        out[_int("logit_bias", token, 0, 2**31 - 1)] = _float("logit_bias", v, -100.0, 100.0)
    return out
