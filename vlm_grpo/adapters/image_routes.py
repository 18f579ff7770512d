"""How the language model reads a family's images (a mixin of VLMAdapter), with defaults for the usual route: image
features placed at placeholder tokens of the sequence.

The other route is cross-attention (Llama 3.2 Vision): the image's states reach the language model through
cross-attention layers, steered by a cross-attention mask shaped like the tokens; one placeholder per image stays in
the sequence as an ordinary token. Such a family sets `cross_attention`, names the mask in `repeated_token_keys`
(a generated token reads what the prompt's last token reads), and the cache layers that hold image states
(`image_cache_layers`, for the simulated faults). Either route may keep text-only rows out of image batches
(`mixes_text_rows`) where its model lets a text row see its batch's images.
"""

from __future__ import annotations

from typing import ClassVar

import torch


class MixedRowsNotSupported(ValueError):
    """Text-only rows batched with image rows, for a family whose model gives a text-only row another result there."""


class ImageRoutes:
    # the images reach the language model through cross-attention, not features at placeholder tokens: one
    # placeholder per image is the image's "feature", there are no image tokens to map attention onto, and the
    # feature/prefix sharing paths stay off
    cross_attention: ClassVar[bool] = False
    # token-shaped inputs ([B, L, ...]) whose completion positions repeat the prompt's last position instead of
    # taking zeros (a cross-attention mask: a generated token reads the images the prompt's end reads, as generate does)
    repeated_token_keys: ClassVar[tuple[str, ...]] = ()
    # text-only rows may share a batch with image rows (and score as when alone); a family whose model lets a text
    # row see the batch's images says why not in `mixed_rows_reason`, and encoding such a batch raises it
    mixes_text_rows: ClassVar[bool] = True
    mixed_rows_reason: ClassVar[str] = ""

    def image_cache_layers(self) -> tuple[int, ...]:
        """KV-cache layers that hold image states in every position (cross-attention layers; default: none)."""
        return ()

    def check_mixed_rows(self, images) -> None:
        """MixedRowsNotSupported naming the first text-only row where this family cannot batch it with image rows."""
        if self.mixes_text_rows or not any(images) or all(images):
            return
        row = next(i for i, sample in enumerate(images) if not sample)
        raise MixedRowsNotSupported(f"sample {row}: a text-only row in a batch with image rows; {self.family} cannot "
                                    f"mix them ({self.mixed_rows_reason}). Batch text-only rows apart")

    def completion_tail(self, key: str, prompt: torch.Tensor, length: int) -> torch.Tensor:
        """A token-shaped input's values over `length` completion tokens of plain text: zeros ([B, length]), or the
        prompt's last position repeated for `repeated_token_keys`."""
        if key in self.repeated_token_keys:
            return prompt[:, -1:].expand(-1, length, *prompt.shape[2:])
        return prompt.new_zeros(prompt.shape[0], length)
