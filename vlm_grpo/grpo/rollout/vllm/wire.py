"""What travels between trainer and server: images as PNG (base64 in JSON), weights as safetensors bytes."""

from __future__ import annotations

import base64
import io

import torch


def png(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def image_from_png(text: str):
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(text))).convert("RGB")


def weights_bytes(items: list[tuple[str, torch.Tensor]]) -> bytes:
    from safetensors.torch import save

    return save({n: t.contiguous() for n, t in items})


def weights_from_bytes(data: bytes) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load

    return list(load(data).items())
