"""How the language model reads a family's images (a mixin of VLMAdapter), with defaults for the usual route: image
features placed at placeholder tokens of the sequence.

The other route is cross-attention (Llama 3.2 Vision): the image's states reach the language model through
cross-attention layers, steered by a cross-attention mask shaped like the tokens; one placeholder per image stays in
the sequence as an ordinary token. Such a family sets `cross_attention`, names the mask in `repeated_token_keys`
(a generated token reads what the prompt's last token reads), and the cache layers that hold image states
(`image_cache_layers`, for the simulated faults). Either route may keep text-only rows out of image batches
(`text_rows`: "apart") where its model lets a text row see its batch's images, or refuse them ("refused") where the
processor needs an image in every prompt.
"""

from __future__ import annotations

from typing import ClassVar

import torch


class TextRowsNotSupported(ValueError):
    """A text-only row where the family cannot take it: beside image rows (`text_rows` "apart"), or at all."""


class ImageRoutes:
    # the images reach the language model through cross-attention, not features at placeholder tokens: one
    # placeholder per image is the image's "feature", there are no image tokens to map attention onto, and the
    # feature/prefix sharing paths stay off
    cross_attention: ClassVar[bool] = False
    # token-shaped inputs ([B, L, ...]) whose completion positions repeat the prompt's last position instead of
    # taking zeros (a cross-attention mask: a generated token reads the images the prompt's end reads, as generate does)
    repeated_token_keys: ClassVar[tuple[str, ...]] = ()
    # text-only rows: "mixed" (beside image rows, scoring as when alone), "apart" (only in batches without image rows:
    # the model lets a text row see its batch's images) or "refused" (the processor needs an image in every prompt);
    # `text_rows_reason` says why, and encoding a batch that breaks the rule raises TextRowsNotSupported with it
    text_rows: ClassVar[str] = "mixed"
    text_rows_reason: ClassVar[str] = ""

    def image_cache_layers(self) -> tuple[int, ...]:
        """KV-cache layers that hold image states in every position (cross-attention layers; default: none)."""
        return ()

    def check_text_rows(self, images) -> None:
        """TextRowsNotSupported naming the first text-only row this family cannot take in this batch."""
        rows = [i for i, sample in enumerate(images) if not sample]
        if not rows or self.text_rows == "mixed" or (self.text_rows == "apart" and len(rows) == len(images)):
            return
        where = "in a batch with image rows" if self.text_rows == "apart" else "(no image)"
        raise TextRowsNotSupported(f"sample {rows[0]}: a text-only row {where}; {self.family} cannot take it "
                                   f"({self.text_rows_reason})")

    def completion_tail(self, key: str, prompt: torch.Tensor, length: int) -> torch.Tensor:
        """A token-shaped input's values over `length` completion tokens of plain text: zeros ([B, length]), or the
        prompt's last position repeated for `repeated_token_keys`."""
        if key in self.repeated_token_keys:
            return prompt[:, -1:].expand(-1, length, *prompt.shape[2:])
        return prompt.new_zeros(prompt.shape[0], length)
