"""What travels between trainer (client.py) and server (server.py), both ways, and the limits the server reads it with.

- /generate/ requests as JSON. The trainer builds vLLM's own requests ({"prompt": text} or {"prompt_token_ids": ids},
  with "multi_modal_data": {"image": [PIL.Image], "video": [(uint8 array [T, H, W, 3], metadata)]}); `request_json`
  turns one into {"prompt" | "prompt_token_ids", "images": [PNG base64], "videos": [{"frames": [PNG base64],
  "metadata": {...}}]} and the server's `native_requests` turns that back, refusing bad input with 400 naming the
  request and the field.
- /update_weights/ as a stream of frames, one tensor at a time (never the whole model as one bytes object): per
  tensor an 8-byte little-endian header length, a JSON header {"name", "dtype", "shape"}, the tensor's bytes (C
  order); then a last header {"end": true, "count": N}. A stream without its end frame is a cut push (400).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import struct
from typing import Any, AsyncIterator, Callable, Iterable, Iterator

import torch

from vlm_grpo.grpo.rollout.vllm.access import AccessError

MAX_TOKEN_ID = 2**31 - 1
MAX_IMAGES = 64  # images in one request
MAX_VIDEOS = 8  # videos in one request
MAX_VIDEO_FRAMES = 1024  # frames in one video
MAX_PIXELS = 2**26  # one image or frame (PIL's own bomb guard starts at 89 M)
MAX_DECODED_BYTES = 2**31  # decoded pixels in one /generate/ call: PNG compresses, the engine gets the pixels
MAX_HEADER_BYTES = 2**16  # one weight frame's JSON header
MAX_TENSOR_BYTES = 2**36  # one pushed tensor when no model shape bounds it
# vLLM pickles a call's arguments to workers in other processes (tensor parallel): a stream cannot reach them
STREAM_NEEDS_ONE_WORKER = ("this server's engine runs in {workers} worker processes (vllm-serve "
                           "--tensor-parallel-size), and vLLM hands its workers a call's arguments pickled, so weights "
                           "cannot stream to them over HTTP without the whole model in memory at once: train with "
                           "rollout.vllm_weight_transport distributed")
SEND_CHUNK = 4 * 2**20  # the client hands the socket at most this many bytes of a tensor at once
FRAME_LENGTH = struct.Struct("<Q")
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool)}
VIDEO_METADATA = ("fps", "duration", "total_num_frames", "frames_indices", "video_backend", "do_sample_frames")


class ServerMismatch(RuntimeError):
    """The server runs another model (or protocol) than the trainer's, or refused its weights."""


# ---------------------------------------------------------------- images
def png(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def image_from_png(text: str, where: str = "image"):
    """A PNG (base64) as an RGB image; anything else, or more than MAX_PIXELS, is refused with 400 naming `where`."""
    from PIL import Image

    unreadable = (binascii.Error, OSError, ValueError, Image.DecompressionBombError)
    if not isinstance(text, str):
        raise AccessError(400, f"{where}: a PNG as base64 text expected")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))  # reads the header only
    except unreadable as err:
        raise AccessError(400, f"{where}: not a readable PNG ({type(err).__name__}: {str(err)[:120]})") from None
    if image.format != "PNG":
        raise AccessError(400, f"{where}: a {image.format} image; PNG expected")
    if image.width * image.height > MAX_PIXELS:
        raise AccessError(400, f"{where}: {image.width}x{image.height} pixels; at most {MAX_PIXELS} per image")
    try:
        return image.convert("RGB")
    except unreadable as err:
        raise AccessError(400, f"{where}: not a readable PNG ({type(err).__name__}: {str(err)[:120]})") from None


# ---------------------------------------------------------------- /generate/ requests
def request_json(req: dict[str, Any]) -> dict[str, Any]:
    """One vLLM-native request as the JSON /generate/ takes (the trainer's side)."""
    out: dict[str, Any] = {}
    if "prompt_token_ids" in req:
        out["prompt_token_ids"] = [int(t) for t in req["prompt_token_ids"]]
    else:
        out["prompt"] = req["prompt"]
    media = req.get("multi_modal_data") or {}
    unknown = set(media) - {"image", "video"}
    if unknown:
        raise ValueError(f"multi_modal_data {sorted(unknown)}: the vLLM server takes images and videos only")
    images = media.get("image") or []
    images = images if isinstance(images, (list, tuple)) else [images]
    if images:
        out["images"] = [png(im) for im in images]
    videos = media.get("video") or []
    videos = videos if isinstance(videos, list) else [videos]
    if videos:
        out["videos"] = [_video_json(v) for v in videos]
    return out


def _video_json(video) -> dict[str, Any]:
    import numpy as np
    from PIL import Image

    frames, metadata = video if isinstance(video, tuple) else (video, {})
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"a video for the vLLM server: uint8 frames [T, H, W, 3] expected, got {frames.dtype} "
                         f"{list(frames.shape)}")
    if metadata.get("do_sample_frames", False):
        raise ValueError("a video for the vLLM server: do_sample_frames must be false (the trainer sampled the "
                         "frames; the server must see the same ones)")
    meta = {k: metadata[k] for k in VIDEO_METADATA if k in metadata}
    if "frames_indices" in meta:
        meta["frames_indices"] = [int(i) for i in meta["frames_indices"]]
    meta["do_sample_frames"] = False
    return {"frames": [png(Image.fromarray(f)) for f in frames], "metadata": meta}


def native_requests(requests: Any, *, max_model_len: int, max_requests: int) -> list[dict[str, Any]]:
    """A /generate/ body's "requests" as vLLM takes them (the server's side), every field checked: 400 names the
    request and the field."""
    if not isinstance(requests, list) or not 0 < len(requests) <= max_requests:
        raise AccessError(400, f"requests must be a list of 1 to {max_requests} prompts")
    budget = [MAX_DECODED_BYTES]
    return [_native(r, f"request {i}", max_model_len, budget) for i, r in enumerate(requests)]


def _native(r: Any, where: str, max_model_len: int, budget: list[int]) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise AccessError(400, f"{where}: {{prompt: text}} or {{prompt_token_ids: [ids]}} expected")
    unknown = sorted(set(r) - {"prompt", "prompt_token_ids", "images", "videos"})
    if unknown:
        raise AccessError(400, f"{where}: fields {', '.join(map(repr, unknown))[:200]} are not taken (prompt or "
                          "prompt_token_ids, images, videos)")
    if ("prompt" in r) == ("prompt_token_ids" in r):
        raise AccessError(400, f"{where}: one of prompt (text) or prompt_token_ids expected")
    if "prompt" in r:
        if not isinstance(r["prompt"], str):
            raise AccessError(400, f"{where}: prompt must be text")
        out: dict[str, Any] = {"prompt": r["prompt"]}
    else:
        ids = r["prompt_token_ids"]
        if not isinstance(ids, list) or not 0 < len(ids) <= max_model_len or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in ids):
            raise AccessError(400, f"{where}: prompt_token_ids must be 1 to {max_model_len} token ids, each 0 to "
                              f"{MAX_TOKEN_ID}")
        out = {"prompt_token_ids": ids}
    media: dict[str, list] = {}
    images = _listed(r, "images", where, MAX_IMAGES)
    if images:
        media["image"] = [_decoded(x, f"{where}: images[{j}]", budget) for j, x in enumerate(images)]
    videos = _listed(r, "videos", where, MAX_VIDEOS)
    if videos:
        media["video"] = [_native_video(v, f"{where}: videos[{j}]", budget) for j, v in enumerate(videos)]
    if media:
        out["multi_modal_data"] = media
    return out


def _listed(r: dict, field: str, where: str, limit: int) -> list:
    value = r.get(field, [])
    if not isinstance(value, list) or len(value) > limit:
        raise AccessError(400, f"{where}: {field} must be a list of at most {limit}")
    return value


def _decoded(text: Any, where: str, budget: list[int]):
    image = image_from_png(text, where)
    budget[0] -= image.width * image.height * 3
    if budget[0] < 0:
        raise AccessError(400, f"{where}: the call's images and frames decode to more than {MAX_DECODED_BYTES} bytes")
    return image


def _native_video(video: Any, where: str, budget: list[int]):
    import numpy as np

    if not isinstance(video, dict) or set(video) - {"frames", "metadata"}:
        raise AccessError(400, f"{where}: {{frames: [PNG base64], metadata: {{...}}}} expected")
    frames = video.get("frames")
    if not isinstance(frames, list) or not 0 < len(frames) <= MAX_VIDEO_FRAMES:
        raise AccessError(400, f"{where}: frames must be a list of 1 to {MAX_VIDEO_FRAMES} PNG frames")
    arrays = [np.asarray(_decoded(f, f"{where}: frames[{t}]", budget)) for t, f in enumerate(frames)]
    if len({a.shape for a in arrays}) > 1:
        raise AccessError(400, f"{where}: frames of different sizes ({sorted({a.shape[:2] for a in arrays})[:4]})")
    return np.stack(arrays), _video_metadata(video.get("metadata", {}), where, len(frames))


def _video_metadata(meta: Any, where: str, frames: int) -> dict[str, Any]:
    if not isinstance(meta, dict) or set(meta) - set(VIDEO_METADATA):
        raise AccessError(400, f"{where}: metadata must be a mapping of {', '.join(VIDEO_METADATA)}")

    def number(v):
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0

    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKEN_ID

    rules = {"fps": number, "duration": number, "total_num_frames": count,
             "frames_indices": lambda v: isinstance(v, list) and len(v) == frames and all(map(count, v)),
             "video_backend": lambda v: isinstance(v, str) and len(v) <= 64,
             "do_sample_frames": lambda v: v is False}
    for key, value in meta.items():
        if not rules[key](value):
            raise AccessError(400, f"{where}: metadata.{key}={str(value)[:60]} is not taken ({_META_HELP[key]})")
    return dict(meta)


_META_HELP = {"fps": "a number >= 0", "duration": "seconds, >= 0", "total_num_frames": "a count",
              "frames_indices": "one index per frame sent", "video_backend": "a name", "do_sample_frames":
              "false: the trainer sampled the frames"}


# ---------------------------------------------------------------- /update_weights/ frames
def weight_frames(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[bytes | memoryview]:
    """The pushed weights as frames, one tensor in memory at a time (the client's body: sent chunked)."""
    count = 0
    for name, tensor in items:
        tensor = tensor.detach()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"weight {name}: dtype {dtype} does not travel to the vLLM server ({', '.join(DTYPES)})")
        tensor = tensor.to("cpu").contiguous()
        header = json.dumps({"name": name, "dtype": dtype, "shape": list(tensor.shape)}).encode()
        yield FRAME_LENGTH.pack(len(header)) + header
        data = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())  # torch's byte view: bf16 included
        for start in range(0, len(data), SEND_CHUNK):
            yield data[start:start + SEND_CHUNK]
        count += 1
    end = json.dumps({"end": True, "count": count}).encode()
    yield FRAME_LENGTH.pack(len(end)) + end


class StreamEnded(Exception):
    """The body ended before the bytes asked for."""


class ByteStream:
    """An async source of byte chunks (a request body), read exactly: `read`, `read_into`, `at_end`, `drain`."""

    def __init__(self, chunks: AsyncIterator[bytes]):
        self._chunks = chunks
        self._pending = memoryview(b"")
        self.received = 0

    async def _fill(self) -> bool:
        while not self._pending:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                return False
            self.received += len(chunk)
            self._pending = memoryview(chunk)
        return True

    async def read_into(self, out: memoryview) -> None:
        filled = 0
        while filled < len(out):
            if not await self._fill():
                raise StreamEnded()
            take = min(len(out) - filled, len(self._pending))
            out[filled:filled + take] = self._pending[:take]
            self._pending = self._pending[take:]
            filled += take

    async def read(self, n: int) -> bytes:
        buf = bytearray(n)
        await self.read_into(memoryview(buf))
        return bytes(buf)

    async def at_end(self) -> bool:
        return not await self._fill()

    async def drain(self) -> None:
        """Read (and drop) the rest, so the sender gets the answer rather than a broken pipe."""
        self._pending = memoryview(b"")
        async for chunk in self._chunks:
            self.received += len(chunk)


async def read_weights(stream: ByteStream, check: Callable[[str, tuple[int, ...]], None] | None = None
                       ) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """The tensors of a weight stream, one at a time as their bytes arrive. `check(name, shape)` runs on each header
    before its bytes are read (it refuses a tensor the model does not have); a malformed or cut stream is 400."""
    count = 0
    while True:
        try:
            header = await _header(stream, count)
            if "end" in header:
                if header != {"end": True, "count": count}:
                    raise AccessError(400, f"weight stream: the end frame {json.dumps(header)[:200]} does not close "
                                      f"the {count} tensors sent")
                if not await stream.at_end():
                    raise AccessError(400, f"weight stream: bytes after the end frame (after {count} tensors)")
                return
            name, dtype, shape = _tensor_header(header, count)
            if check is not None:
                check(name, shape)
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > MAX_TENSOR_BYTES:
                raise AccessError(400, f"weight stream: tensor {name!r} of {nbytes} bytes; at most {MAX_TENSOR_BYTES}")
            data = torch.empty(nbytes, dtype=torch.uint8)
            await stream.read_into(memoryview(data.numpy()))
        except StreamEnded:
            raise AccessError(400, f"weight stream: the body ended after {count} tensors, without its end frame: "
                              "the push was cut short (push again)") from None
        yield name, data.view(dtype).reshape(shape)
        count += 1


async def _header(stream: ByteStream, count: int) -> dict[str, Any]:
    (length,) = FRAME_LENGTH.unpack(await stream.read(FRAME_LENGTH.size))
    if not 2 <= length <= MAX_HEADER_BYTES:
        raise AccessError(400, f"weight stream: frame {count} declares a {length}-byte header (2 to "
                          f"{MAX_HEADER_BYTES}): not a vlm-grpo weight stream")
    try:
        header = json.loads(await stream.read(length))
    except (UnicodeDecodeError, ValueError):
        raise AccessError(400, f"weight stream: frame {count}'s header is not JSON") from None
    if not isinstance(header, dict):
        raise AccessError(400, f"weight stream: frame {count}'s header is not a mapping")
    return header


def _tensor_header(header: dict[str, Any], count: int) -> tuple[str, torch.dtype, tuple[int, ...]]:
    name, dtype, shape = header.get("name"), header.get("dtype"), header.get("shape")
    if set(header) != {"name", "dtype", "shape"} or not isinstance(name, str) or not 0 < len(name) <= 1024:
        raise AccessError(400, f"weight stream: frame {count}'s header must be {{name, dtype, shape}}, got "
                          f"{json.dumps(header)[:200]}")
    if dtype not in DTYPES:
        raise AccessError(400, f"weight stream: tensor {name!r} has dtype {str(dtype)[:40]!r}; taken: "
                          f"{', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > 16 or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_TENSOR_BYTES for s in shape):
        raise AccessError(400, f"weight stream: tensor {name!r} has shape {str(shape)[:80]}; a list of sizes expected")
    return name, DTYPES[dtype], tuple(shape)
