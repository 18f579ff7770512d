"""Who may use a `vlm-grpo vllm-serve` server, and what they may ask of it.

The server takes weights and runs sampling for whoever reaches its port, so every request must carry its key
(`Authorization: Bearer KEY`, vLLM's own `--api-key` convention), compared in constant time. The key is given to
the server (`--api-key-file`, or VLM_GRPO_VLLM_KEY) or made at start and printed once; the trainer reads it from
VLM_GRPO_VLLM_KEY or `rollout.vllm_server_key_file` (never a setting's value: settings are saved with the run).
A web page cannot send that header to another origin without the server's consent (CORS), so a page the user opens
reaches nothing either.

A request's sampling options are an allow-list with limits (what the trainer sends, `requests.sampling_options`),
never handed to vLLM's SamplingParams unchecked: `n: 1e9` or an unknown keyword is refused with 400, naming it.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import secrets
import socket
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


class AccessError(ValueError):
    """A request the server refuses: `status` is its HTTP code."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


# ---------------------------------------------------------------- the key
def new_key() -> str:
    return secrets.token_urlsafe(32)


def read_key_file(path: str | Path, what: str) -> str:
    try:
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


def checked_sampling(options: Any, *, max_model_len: int, requests: int) -> dict[str, Any]:
    """The request's sampling options as SamplingParams may take them: only the trainer's keys, each in range."""
    if not isinstance(options, dict):
        raise AccessError(400, "sampling must be a mapping of options")
    rules = {
        "n": lambda v: _int("n", v, 1, 1024),
        "temperature": lambda v: _float("temperature", v, 0.0, 100.0),
        "top_p": lambda v: _float("top_p", v, 1e-6, 1.0),
        "top_k": lambda v: _int("top_k", v, -1, 2**31 - 1),
        "max_tokens": lambda v: _int("max_tokens", v, 1, max_model_len),
        "min_tokens": lambda v: _int("min_tokens", v, 0, max_model_len),
        "logprobs": lambda v: None if v is None else _int("logprobs", v, 0, 20),
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
    if requests * out.get("n", 1) > MAX_COMPLETIONS:
        raise AccessError(400, f"{requests} prompts x n={out.get('n', 1)} completions: at most {MAX_COMPLETIONS} "
                          "per call")
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


def checked_requests(body: Any) -> list[dict]:
    """A /generate/ body's prompts: a list of at most MAX_REQUESTS {prompt: str, images: [str]}."""
    reqs = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(reqs, list) or not 0 < len(reqs) <= MAX_REQUESTS:
        raise AccessError(400, f"requests must be a list of 1 to {MAX_REQUESTS} prompts")
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or not isinstance(r.get("prompt"), str) or not isinstance(r.get("images", []), list) \
                or not all(isinstance(x, str) for x in r.get("images", [])):
            raise AccessError(400, f"request {i}: {{prompt: text, images: [PNG base64]}} expected")
    return reqs
