"""InternVL (native transformers classes): images become square tiles, each tile a fixed token run.

The processor crops an image into a grid of tiles (plus a thumbnail when there is more than one)
and stacks every tile of every image into one flat `pixel_values` [total_tiles, 3, H, W]. It does
not return how many tiles each image got, so the adapter recomputes that from the image sizes with
the image processor's own tiling rule and records it as `mm_rows["pixel_values"]`.
"""

from __future__ import annotations

import torch
from transformers import (
    GotOcr2ImageProcessor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVideoProcessor,
)

from vlm_grpo.adapters.base import LLAVA_STYLE_GROUPS, VLMAdapter, grid_cells
from vlm_grpo.adapters.batch import PromptBatch, sum_per_sample
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.registry import register
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

INTERNVL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<video>",
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
]
# The processor finds these through the tokenizer's named special tokens.
INTERNVL_NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}

# InternVL3-hf's ChatML layout, no default system turn. An image part is one <IMG_CONTEXT>, which
# the processor expands to <img> + <IMG_CONTEXT> * image_seq_length * tiles + </img>.
INTERNVL_CHAT_TEMPLATE = chatml_template("<IMG_CONTEXT>\n", default_system=None, video_part="<video>\n")


def internvl_tokenizer():
    return build_tokenizer(
        INTERNVL_SPECIAL_TOKENS,
        chat_template=INTERNVL_CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=INTERNVL_NAMED_TOKENS,
    )


def tokens_per_tile(vision: dict, downsample_ratio: float) -> int:
    """Tokens one tile gives: its patch grid, shrunk by pixel shuffle in each direction."""
    side = vision["image_size"] // vision["patch_size"]
    return int(side * downsample_ratio) ** 2


def internvl_processor(tokenizer, *, tile: int, max_patches: int, image_seq_length: int) -> InternVLProcessor:
    size = {"height": tile, "width": tile}
    return InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1, max_patches=max_patches),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=size),
        image_seq_length=image_seq_length,
        chat_template=tokenizer.chat_template,
    )


def internvl_config(
    tokenizer, *, vision: dict, text: dict, downsample_ratio: float = 0.5, vocab_size: int | None = None
) -> InternVLConfig:
    text = {
        "model_type": "qwen2",
        "vocab_size": vocab_size or len(tokenizer),
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **text,
    }
    return InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=tokens_per_tile(vision, downsample_ratio),
        downsample_ratio=downsample_ratio,
        tie_word_embeddings=text.get("tie_word_embeddings", False),
    )


# 56-px tiles, 14-px patches: a 4x4 patch grid -> pixel shuffle 0.5 -> 2x2 = 4 tokens per tile.
TINY_VISION = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=56, patch_size=14,
    attention_bias=True, layer_scale_init_value=0.1,
)
TINY_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    # Untied in the tiny twin so that the `head` module group is not empty (freeze tests need it).
    tie_word_embeddings=False,
)
TINY_TILES = dict(tile=56, max_patches=4)

# Public architecture of OpenGVLab/InternVL3-1B-hf: InternViT-300M-448px + Qwen2.5-0.5B.
VISION_1B = dict(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, image_size=448,
    patch_size=14, hidden_act="gelu", attention_bias=True, use_qk_norm=False, norm_type="layer_norm",
    layer_norm_eps=1e-6, layer_scale_init_value=0.1, use_mean_pooling=True, use_absolute_position_embeddings=True,
)
TEXT_1B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    # InternVL3-1B unties lm_head from the embeddings (its config says tie_word_embeddings: false),
    # unlike the Qwen2.5-0.5B it started from; that is why it has ~0.94B parameters, not ~0.8B.
    max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
)
INTERNVL_VOCAB = 151674
REAL_TILES = dict(tile=448, max_patches=12)


def build_internvl_adapter(adapter_cls, *, vision, text, tiles, seed, dtype=torch.float32, vocab_size=None):
    tokenizer = internvl_tokenizer()
    config = internvl_config(tokenizer, vision=vision, text=text, vocab_size=vocab_size)
    processor = internvl_processor(tokenizer, image_seq_length=config.image_seq_length, **tiles)
    model = seeded_model(InternVLForConditionalGeneration, config, seed, dtype)
    return adapter_cls(model, processor, source=f"tiny:{adapter_cls.family}")


class InternVLAdapter(VLMAdapter):
    family = "internvl"
    model_types = ("internvl",)
    model_class = InternVLForConditionalGeneration
    module_patterns = LLAVA_STYLE_GROUPS
    presets = {
        "internvl3_1b": lambda seed=0, dtype=torch.bfloat16: build_internvl_adapter(
            InternVLAdapter, vision=VISION_1B, text=TEXT_1B, tiles=REAL_TILES, seed=seed, dtype=dtype,
            vocab_size=INTERNVL_VOCAB,
        )
    }

    @classmethod
    def tiny(cls, seed: int = 0) -> "InternVLAdapter":
        return build_internvl_adapter(cls, vision=TINY_VISION, text=TINY_TEXT, tiles=TINY_TILES, seed=seed)

    def _extra_suppressed_ids(self) -> list[int]:
        ids = self.tokenizer.convert_tokens_to_ids
        proc = self.processor
        return [ids(proc.start_image_token), ids(proc.end_image_token), ids(proc.video_token)]

    @property
    def image_seq_length(self) -> int:
        """Features one tile gives, from the vision config (what the model produces, not what the processor writes)."""
        cfg = self.model.config
        vision = {"image_size": cfg.vision_config.image_size[0], "patch_size": cfg.vision_config.patch_size[0]}
        return tokens_per_tile(vision, cfg.downsample_ratio)

    def tiles_for_images(self, images) -> list[int]:
        """Tiles per image by the image processor's own tiling rule (thumbnail included)."""
        if not images:
            return []
        sizes = [(img.height, img.width) for img in images]
        # The processor's own count (same merged kwargs as its __call__), so the two cannot drift apart.
        return list(self.processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_patches"])

    def _to_batch(self, features, images) -> PromptBatch:
        n_images = [len(s) for s in images]
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            per_image = self.tiles_for_images([img for sample in images for img in sample])
            total = features["pixel_values"].shape[0]
            if sum(per_image) != total:
                raise ValueError(f"InternVL processor made {total} tiles; its tiling rule says {sum(per_image)}")
            mm["pixel_values"] = features["pixel_values"]
            mm_rows["pixel_values"] = sum_per_sample(per_image, n_images)
        return self._batch(features, images, mm, mm_rows)

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        # From the tile rows, never from the tokens, so a tampered prompt shows as a mismatch.
        tiles = batch.mm_rows.get("pixel_values", [0] * len(batch))
        return [n * self.image_seq_length for n in tiles]

    def tiles_per_image(self, batch: PromptBatch, sample: int) -> list[int]:
        """Tiles of each image of `sample`, in order; the thumbnail (when present) is the last tile."""
        return [(end - start) // self.image_seq_length for start, end in batch.image_spans[sample]]

    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(rows, cols) of the token grid of ONE tile (same for every tile and image).

        The image's span holds tiles_per_image(batch, sample)[image] such grids back to back, each
        row-major; reshape the span to [tiles, rows, cols] for a per-tile attention map.
        """
        side = int(round(self.image_seq_length**0.5))
        return side, side

    def tile_layout(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of crops the image processor cuts an image of (height, width) into (1, 1: no split)."""
        from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

        ip = self.processor.image_processor
        kwargs = self.processor._merge_kwargs()["images_kwargs"]  # the processor's own merged settings
        if not kwargs.get("crop_to_patches", ip.crop_to_patches):
            return 1, 1
        max_patches = kwargs.get("max_patches", ip.max_patches)
        if max_patches <= 1:
            return 1, 1
        size = kwargs.get("size", ip.size)
        tile_h, tile_w = (size["height"], size["width"]) if isinstance(size, dict) else (size.height, size.width)
        cols, rows = get_optimal_tiled_canvas(
            tuple(image_size), (tile_h, tile_w), kwargs.get("min_patches", ip.min_patches), max_patches
        )
        return rows, cols

    def image_token_positions(self, batch, sample, image, image_size=None):
        """Crops row-major over the image (each a tile token grid, row-major), then the thumbnail over all of it."""
        tokens = self.image_token_indices(batch, sample, image)
        side_r, side_c = self.image_grid(batch, sample, image)
        per_tile = side_r * side_c
        tiles = len(tokens) // per_tile
        if tiles == 1:
            return grid_cells(tokens, side_r, side_c)
        if image_size is None:
            raise ValueError("InternVL: the crop layout of a tiled image depends on its size; pass image_size")
        rows, cols = self.tile_layout(image_size)
        if rows * cols + 1 != tiles:
            raise ValueError(f"InternVL: {tiles} tiles in the prompt but the tiling rule gives {rows}x{cols} + thumbnail")
        cells = []
        for t in range(rows * cols):
            r, c = divmod(t, cols)
            box = (r / rows, c / cols, (r + 1) / rows, (c + 1) / cols)
            cells += grid_cells(tokens[t * per_tile : (t + 1) * per_tile], side_r, side_c, box)
        return cells + grid_cells(tokens[-per_tile:], side_r, side_c)


register(InternVLAdapter)
