"""Llama 3.2 Vision (mllama): a tiled ViT whose states the language model reads through gated cross-attention layers
interleaved with its self-attention layers; the image is never spliced into the token sequence.

The prompt holds one `<|image|>` token per image (an ordinary embedded token). The processor returns every sample's
tiles padded to the batch's image and tile counts (`pixel_values` [B, images, tiles, 3, H, W], `aspect_ratio_ids`,
`aspect_ratio_mask`: one row per sample) and a `cross_attention_mask` [B, L, images, tiles] saying which tiles each
token may read: from an image's token on. It is token-shaped along L, and a generated token reads what the prompt's
last token reads (`generate` repeats that row), so it is a `repeated_token_key` of the contract. A row without an
image reads no tile and its cross-attention layers pass it through unchanged, so text-only rows mix with image rows.

Features are not placed at tokens, so the shared-feature and shared-prefix paths stay off (`cross_attention`), and a
"feature" of the contract is the image's one placeholder.
"""

from __future__ import annotations

import torch
from transformers import MllamaForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import ImageSources, PromptBatch
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.mllama import MllamaTwin

MLLAMA_LAYOUT = ModuleLayout(
    vision=(r"model\.vision_model\.",),
    projector=(r"model\.multi_modal_projector\.",),
    language=(r"model\.language_model\.",),
)

PER_SAMPLE_KEYS = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")


class MllamaAdapter(MllamaTwin, VLMAdapter):
    family = "mllama"
    model_types = ("mllama",)
    model_class = MllamaForConditionalGeneration
    module_layout = MLLAMA_LAYOUT
    pixel_keys = PER_SAMPLE_KEYS
    cross_attention = True
    text_rows = "apart"
    text_rows_reason = ("transformers' mllama lets a token that may read no image attend to every vision state of its "
                         "row, so a text-only row beside image rows reads padding states it never reads alone: "
                         "log-probs moved by ~1e-2 on the tiny twin")
    repeated_token_keys = ("cross_attention_mask",)
    shares_features = False
    shares_prefix = False
    joins_encoded_rows = False  # each row's images pad to the batch's most slots inside the cross-attention mask

    def suppressed_token_ids(self) -> list[int]:
        # The real checkpoints put <|image|> past the output head (id 128256 of 128256 logits): it cannot be emitted.
        head = self.model.get_output_embeddings().weight.shape[0]
        return [i for i in super().suppressed_token_ids() if i < head]

    def _run_processor(self, texts, images, **text_options):
        # The chat template opens with <|begin_of_text|>: a tokenizer adding one too would double it. The processor
        # wants a list of images per sample (an empty one for a text-only row) when any sample has one.
        return self.processor(text=texts, images=images if any(images) else None, padding=True, return_tensors="pt",
                              **{**text_options, "add_special_tokens": False})

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:  # one row per sample, padded to the batch's images and tiles
            for key in (*PER_SAMPLE_KEYS, "cross_attention_mask"):
                mm[key], mm_rows[key] = features[key], [1] * len(images)
            _pad_with_first_image(mm, [len(s) for s in images])
        return self._batch(features, images, mm, mm_rows, token_keys=tuple(k for k in mm if k == "cross_attention_mask"))

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        """One placeholder per image: the image slots some token of the row may read."""
        if "cross_attention_mask" not in batch.mm:
            return [0] * len(batch)
        return (batch.mm["cross_attention_mask"].amax(dim=(1, 3)) > 0).sum(dim=1).tolist()

    def _group_runs(self, runs, n_images):
        """Each placeholder is an image, adjacent ones too (`<|image|><|image|>` is two images)."""
        return [(k, k + 1) for start, end in runs for k in range(start, end)]

    def combine_images(self, sources: ImageSources, keys):
        raise NotImplementedError(f"{self.family}: images shown in later turns would need the cross-attention mask "
                                  "rebuilt over the turns; use a family whose images are tokens for tool recipes")

    def layout_facts(self, batch, sample, image):
        raise NotImplementedError(f"{self.family} reads images through cross-attention: no image tokens to map")

    def image_token_positions(self, batch, sample, image, image_size=None):
        raise NotImplementedError(f"{self.family} reads images through cross-attention: no image tokens to map")

    def image_cache_layers(self) -> tuple[int, ...]:
        return tuple(self.model.config.get_text_config().cross_attention_layers)

    def vision_call_images(self, args, kwargs) -> int:
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        return int(pixels.shape[0] * pixels.shape[1]) if isinstance(pixels, torch.Tensor) else 0


def _pad_with_first_image(mm: dict[str, torch.Tensor], images_per_row: list[int]) -> None:
    """Fill each row's padding image slots with a copy of its first image (the mask keeps every token off them).

    A token before a row's first image may read no image: transformers' mllama then lets it attend to all the row's
    vision states, padding slots included. With copies there, its softmax spreads the same weights over duplicates
    and the result equals the row encoded alone (which has no padding slots)."""
    for row, n in enumerate(images_per_row):
        if 0 < n < mm["pixel_values"].shape[1]:
            for key in PER_SAMPLE_KEYS:
                mm[key][row, n:] = mm[key][row, :1]
