"""The adapter contract: what a model family defines for the GRPO loop.

A family is one subclass of `VLMAdapter` in `adapters/families/` (with its twin in `adapters/twins/`). It MUST declare
the class attributes and implement the abstract methods of the first two sections; its twin class (mixed into the
adapter) declares `tiny_architecture` and `presets` and implements `build`. The hooks of the last section have
defaults that a family overrides only where its model differs (M-RoPE positions, extra token-shaped inputs, extra
feature layers, delimiter tokens); the video side (video_hooks.py) and the routes of image features other than
placement at tokens (image_routes.py: cross-attention, text-only rows) are hooks of the contract too. What every
family shares on top of it (construction, prompt encoding, model calls, parameter groups) is in the modules `base.py`
lists.

Visual items: a prompt's image and video parts take the sample's images and videos (vlm_grpo.videos.Video) in order.
A family whose model reads video sets `takes_video` and accepts `videos=` in `_run_processor` and `_to_batch`; with
video tensors and a token of their own it names them (`video_keys`, `video_encoder_keys`, `video_token_id`) and counts
their features (`video_feature_counts`, `video_units`, `video_unit_cells`). Other families refuse a video, named.
A text-only family (`reads_images` False) has no vision groups and no placeholder: it refuses an image, named.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self, Sequence

import torch
from PIL import Image

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.batch import ImageSources, PromptBatch, combine_rows
from vlm_grpo.adapters.features import ImageFeatures
from vlm_grpo.adapters.image_layout import ImageCell, LayoutFacts
from vlm_grpo.adapters.image_routes import ImageRoutes
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.quirks import CacheQuirk
from vlm_grpo.adapters.video_hooks import VideoHooks
from vlm_grpo.videos import Video


class AdapterContract(VideoHooks, ImageRoutes, ABC):
    """What a family defines; `VLMAdapter` (base.py) adds the shared machinery."""

    # ================================================================ MUST declare
    family: ClassVar[str]  # the name used in `--model family:PATH` and `tiny:family`
    model_types: ClassVar[tuple[str, ...]]  # config.model_type values this adapter serves
    model_class: ClassVar[type]  # transformers class used by `load`
    module_layout: ClassVar[ModuleLayout]  # the module groups: freezing, learning rates, LoRA targets
    tiny_architecture: ClassVar[Architecture]  # the tiny twin's sizes
    presets: ClassVar[dict[str, Architecture]] = {}  # name -> a real-size (or benchmark) architecture
    reads_images: ClassVar[bool] = True  # False: a text-only model (no vision groups, no placeholder token)
    # the families table's words where `model_types` is empty or `model_class` is a base class
    model_types_note: ClassVar[str] = ""
    model_class_note: ClassVar[str] = ""

    @classmethod
    def serves_model_type(cls, model_type: str, auto_classes=()) -> bool:  # beyond `model_types`, by a rule
        return False

    # ================================================================ MUST implement (build: in the family's twin)
    @classmethod
    @abstractmethod
    def build(cls, arch: Architecture, seed: int = 0, dtype: torch.dtype = torch.float32) -> Self:
        """The family's real model and processor classes at `arch`'s sizes, random weights drawn from `seed`,
        with a locally built tokenizer carrying the family's special tokens and chat template."""

    @abstractmethod
    def _to_batch(self, features: Any, images: list[list[Image.Image]]) -> PromptBatch:
        """Processor output -> PromptBatch with `mm`/`mm_rows` filled in (usually ends with `self._batch`)."""

    @abstractmethod
    def feature_counts(self, batch: PromptBatch) -> list[int]:
        """Image features the vision side will produce per sample, from the image tensors (never the tokens)."""

    @abstractmethod
    def image_token_positions(
        self, batch: PromptBatch, sample: int, image: int, image_size: tuple[int, int] | None = None
    ) -> list[ImageCell]:
        """One ImageCell per placeholder token of one image, in prompt order: the rectangle of the original image
        (normalized, y down) it encodes. `image_size` is the original (height, width) where the layout depends on it."""

    @abstractmethod
    def layout_facts(self, batch: PromptBatch, sample: int, image: int) -> LayoutFacts:
        """Tiles and per-tile token grid of one encoded image, read off the processor tensors and the config."""

    # ================================================================ optional hooks (defaults)
    # tensors read only by the vision encoder: dropped once features are computed (sharing.text_side)
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "pixel_attention_mask")
    # token-shaped inputs the forward still needs beside `inputs_embeds` (e.g. token types behind the mask)
    embedding_forward_keys: ClassVar[tuple[str, ...]] = ()
    # the faster paths of sharing.py hold for this model: image features encoded once and placed at the image
    # tokens (`shares_features`); a prompt prefilled once, its KV cache expanded G times (`shares_prefix`).
    # Family files prove them in the contract suite; the generic adapter measures them per model (calibrate.py).
    shares_features: ClassVar[bool] = True
    shares_prefix: ClassVar[bool] = True
    # the completion pass after a shared prefix may run padding-free: completions packed end to end under a 4-D mask,
    # with their padded-layout positions (grpo/logprobs/packing.py); the contract suite proves the log-probs equal
    packs_completions: ClassVar[bool] = True
    # one-row encodings joined by `join_rows` equal the rows encoded together (tokens, masks, every tensor): rows may
    # then be kept across steps (prompt_cache.py). The contract suite proves it per family; False: always encoded.
    joins_encoded_rows: ClassVar[bool] = True
    # known generation-cache quirks by transformers version: `auto` skips the KV cache where one applies (compat/)
    cache_quirks: ClassVar[tuple[CacheQuirk, ...]] = ()

    def _extra_suppressed_ids(self) -> list[int]:
        """Delimiter and layout tokens beside the image placeholder that the policy must not emit."""
        return []

    def _run_processor(self, texts: list[str], images: list[list[Image.Image]], videos: list[list[Video]] | None = None,
                       **text_options):
        flat = [img for sample in images for img in sample]
        clips = [v for sample in videos or [] for v in sample]
        video_args = {"videos": [v.frames for v in clips], "video_metadata": [v.metadata() for v in clips],
                      "do_sample_frames": False} if clips else {}  # frames were sampled when the data was read
        return self.processor(text=texts, images=flat or None, padding=True, return_tensors="pt", **video_args,
                              **text_options)

    def combine_images(self, sources: ImageSources, keys: Sequence[str]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
        """(mm, mm_rows) of new samples for `keys`: sample k shows the images of samples `sources[k]` ((batch,
        index) pairs: a row's prompt, then its tool turns) in order. Default: leading rows per sample (flat
        layouts); a family whose tensors pad per sample overrides it."""
        return combine_rows(sources, keys)

    def can_join(self, rows: Sequence[PromptBatch]) -> bool:
        """Whether `join_rows` (prompt_encoding.py) gives these one-row encodings exactly as the processor would have
        encoded their rows together. Default: when each family tensor has the same trailing shape in every row (a
        processor padding to the batch's largest image or tile count pads nothing then); a family whose
        `combine_images` pads as its processor does overrides it."""
        for key in dict.fromkeys(k for row in rows for k in row.mm if k not in row.token_keys):
            if len({tuple(row.mm[key].shape[1:]) for row in rows if key in row.mm}) > 1:
                return False
        return True

    def _group_runs(self, runs: list[tuple[int, int]], n_images: int) -> list[tuple[int, int]]:
        """Runs of placeholder tokens -> one [start, end) per image (default: a run is an image)."""
        return runs

    def extra_image_features(self, encoder_output: Any) -> tuple[torch.Tensor, ...]:
        """Per-token features beyond `pooler_output` that the model feeds into later layers (default: none)."""
        return ()

    def inputs_with_features(self, full_inputs: dict[str, torch.Tensor], features: ImageFeatures,
                             core: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Model kwargs that carry precomputed image features instead of pixels (default: token embeddings with
        the features placed at the image tokens, as the models' own forwards do)."""
        ids = full_inputs["input_ids"]
        embeds = core.get_input_embeddings()(ids)
        placed = [(self.image_token_id, features)]
        if features.videos is not None and self.video_token_id != self.image_token_id:
            placed.append((self.video_token_id, features.videos))
        for token_id, feats in placed:
            if feats.flat.shape[0]:
                mask = (ids == token_id).unsqueeze(-1)
                embeds = embeds.masked_scatter(mask, feats.flat.to(embeds.device, embeds.dtype))
        kept = {k: full_inputs[k] for k in self.embedding_forward_keys if k in full_inputs}
        return {"inputs_embeds": embeds, "attention_mask": full_inputs["attention_mask"], **kept}

    def shared_position_ids(self, full_inputs: dict[str, torch.Tensor], core: torch.nn.Module) -> torch.Tensor | None:
        """Position ids for a features forward, given the kwargs the plain forward would get (default: whatever
        `completion_inputs` set; None lets the model count positions itself)."""
        return full_inputs.get("position_ids")

    def expand_generation_state(self, prefix: PromptBatch, repeats: int, core: torch.nn.Module) -> None:
        """After prefilling `prefix` and expanding its KV cache `repeats` times: expand any per-row state the model
        keeps outside the cache (default: none)."""

    def vision_call_images(self, args: tuple, kwargs: dict) -> int:
        """Images (tiles, for tiled families) one call of the vision tower encodes."""
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        return int(pixels.shape[0]) if isinstance(pixels, torch.Tensor) else 0
