"""Encoded prompts kept across steps and epochs: each row's PromptBatch (its tokens and processed pixels), keyed by
its content, in an LRU bounded by bytes.

A row seen again (the next epoch, or the same prompt in another step) skips the processor: its cached one-row
encoding is joined with the others into the step's batch (`PromptEncoding.encode_prompts`). The key is the row's
content, never an object's identity: the rendered prompt text, each image's mode, size and pixel bytes (hashed),
and a fingerprint of the processor's settings. A changed image, even the same object edited in place, is a miss.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Sequence

from PIL import Image

from vlm_grpo.adapters.batch import PromptBatch

MIB = 1024 * 1024


class PromptCache:
    """Least recently used one-row PromptBatches, at most `max_bytes` of tensors in all (0: keeps nothing)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"prompt cache size {max_bytes} bytes: give 0 (off) or more")
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # False once a step's rows could not be joined exactly (images padded to the batch's largest, of other sizes):
        # from then on the run's rows are encoded together, so no later step pays for encoding them twice
        self.joins = True
        self._rows: OrderedDict[bytes, tuple[PromptBatch, int]] = OrderedDict()

    @classmethod
    def of_mib(cls, mib: int) -> "PromptCache":
        return cls(int(mib) * MIB)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.joins

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> PromptBatch | None:
        entry = self._rows.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._rows.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: bytes, row: PromptBatch) -> None:
        """Keep `row` (dropping the least recently used rows until it fits); a row larger than the bound is not kept."""
        size = batch_bytes(row)
        if key in self._rows:
            self.bytes -= self._rows.pop(key)[1]
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            self.bytes -= self._rows.popitem(last=False)[1][1]
        self._rows[key] = (row, size)
        self.bytes += size

    def clear(self) -> None:
        self._rows.clear()
        self.bytes = 0


def batch_bytes(batch: PromptBatch) -> int:
    """Bytes of a PromptBatch's tensors (the token side, the family's tensors and its bookkeeping)."""
    tensors = [batch.input_ids, batch.attention_mask, *batch.mm.values(), *batch.meta.values()]
    return sum(t.numel() * t.element_size() for t in tensors)


def row_key(fingerprint: bytes, text: str, images: Sequence[Image.Image]) -> bytes:
    """A row's content: the processor's fingerprint, the rendered prompt, each image's mode, size and pixels."""
    digest = hashlib.blake2b(fingerprint, digest_size=32)
    _feed(digest, text.encode("utf-8"))
    for img in images:
        _feed(digest, f"{img.mode}:{img.width}x{img.height}".encode())
        _feed(digest, img.tobytes())
    return digest.digest()


def processor_fingerprint(adapter: Any) -> bytes:
    """What beside the prompt text and the pixels decides a row's encoding: the adapter's and processor's classes, the
    image processor's settings, and how the tokenizer pads (read each call: a setting changed mid-run is a miss)."""
    processor = adapter.processor
    image_processor = getattr(processor, "image_processor", None)
    tokenizer = getattr(processor, "tokenizer", processor)
    parts = [type(adapter).__qualname__, type(processor).__qualname__, type(image_processor).__qualname__,
             repr(sorted(image_processor.to_dict().items())) if hasattr(image_processor, "to_dict") else "",
             type(tokenizer).__qualname__, str(getattr(tokenizer, "name_or_path", "")), str(len(tokenizer)),
             str(tokenizer.padding_side), str(tokenizer.pad_token_id),
             repr(sorted((k, repr(v)) for k, v in vars(processor).items()
                         if isinstance(v, (int, float, str, bool, tuple, type(None)))))]
    return hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=32).digest()


def _feed(digest, data: bytes) -> None:
    digest.update(len(data).to_bytes(8, "little"))  # length-prefixed: no two rows' parts run into each other
    digest.update(data)
