"""Per-step work counters: vision-encoder calls and the images (tiles) they encoded.

A forward pre-hook on each model's vision tower (found through the adapter's `vision` module group)
counts every call, wherever it comes from: generate(), a plain forward, or `image_features`.
"""

from __future__ import annotations

import torch

from vlm_grpo.adapters.module_groups import vision_module


class VisionCounter:
    def __init__(self, adapter, models: list[torch.nn.Module]):
        self.adapter = adapter
        self.calls = 0
        self.images = 0
        self._handles = []
        seen = set()
        for model in models if adapter.reads_images else ():  # a text-only model has no tower to count
            module = vision_module(adapter.module_layout, model, adapter.family)
            if id(module) in seen:
                continue
            seen.add(id(module))
            self._handles.append(module.register_forward_pre_hook(self._count, with_kwargs=True))

    def _count(self, module, args, kwargs):
        self.calls += 1
        self.images += self.adapter.vision_call_images(args, kwargs)

    def reset(self) -> None:
        self.calls = self.images = 0

    def snapshot(self) -> dict[str, int]:
        return {"calls": self.calls, "images": self.images}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> "VisionCounter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
