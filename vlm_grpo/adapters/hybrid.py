"""Hybrid VLMs: a donor vision tower + a donor LM (see compose.py for how they are assembled).

- `HybridAdapter` ("hybrid"): the seed's pairing inside the Qwen2.5-VL classes; it behaves exactly
  like the Qwen2.5-VL adapter once loaded. `--model hybrid:DIR` also accepts a LLaVA-classes hybrid.
- `LlavaHybridAdapter` ("hybrid_llava"): SigLIP/CLIP + any causal LM inside the LLaVA classes.
"""

from __future__ import annotations

import torch
from transformers import (
    LlavaForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
    SiglipImageProcessor,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from vlm_grpo.adapters.base import LLAVA_STYLE_GROUPS, VLMAdapter, grid_cells
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.compose import assemble_llava, assemble_qwen, mrope_section
from vlm_grpo.adapters.qwen2_5_vl import (
    QWEN_VOCAB,
    REAL_PIXELS,
    VISION_3B,
    Qwen2_5_VLAdapter,
    build_qwen_adapter,
    qwen_tokenizer,
)
from vlm_grpo.adapters.registry import read_model_type, register
from vlm_grpo.adapters.seeding import seeded

# Deliberately not the tiny Qwen2.5-VL's text width (64), so the merger really changes shape.
TINY_LM = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
)
TINY_SIGLIP = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
)
# Public architecture of Qwen/Qwen2.5-0.5B, with its 64-dim heads split for M-RoPE.
TEXT_0_5B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope_section(64)},
)


def tiny_qwen2_lm(seed: int, *, tie: bool) -> tuple[Qwen2ForCausalLM, object]:
    """A tiny Qwen2 causal LM and its tokenizer: the language donor of both tiny hybrids."""
    tokenizer = qwen_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=tie, bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **TINY_LM,
    )
    with seeded(seed):
        return Qwen2ForCausalLM(config).eval(), tokenizer


def _build_3b_vit_0_5b(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> "HybridAdapter":
    vision = {**VISION_3B, "out_hidden_size": TEXT_0_5B["hidden_size"]}
    return build_qwen_adapter(
        HybridAdapter, vision=vision, text=TEXT_0_5B, pixels=REAL_PIXELS, seed=seed, dtype=dtype, vocab_size=QWEN_VOCAB
    )


# The shipped `pretrained:shapes-tiny` before training (`vlm-grpo sft --model preset:shapes_tiny_init`): a LLaVA
# hybrid sized for 64-px shape counting on CPU. Weights come from the seed alone, always in float32.
SHAPES_TINY_SIGLIP = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8,
)
SHAPES_TINY_LM = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
)


def _build_shapes_tiny_init(seed: int = 0, dtype: torch.dtype | None = None) -> "LlavaHybridAdapter":
    del dtype  # trained on CPU in float32 whatever the preset default
    vision_cfg = SiglipVisionConfig(**SHAPES_TINY_SIGLIP)
    with seeded(seed):
        vision = SiglipVisionModel(vision_cfg).eval()
    tokenizer = qwen_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **SHAPES_TINY_LM,
    )
    with seeded(seed + 1):
        lm = Qwen2ForCausalLM(config).eval()
    size = {"height": vision_cfg.image_size, "width": vision_cfg.image_size}
    composed = assemble_llava(vision, SiglipImageProcessor(size=size), lm, tokenizer, seed=seed)
    return LlavaHybridAdapter(composed.model, composed.processor, source="preset:shapes_tiny_init")


class HybridAdapter(Qwen2_5_VLAdapter):
    family = "hybrid"
    model_types = ()  # a composed checkpoint says qwen2_5_vl (or llava): bare paths go to those adapters
    presets = {"hybrid_3b_vit_0_5b": _build_3b_vit_0_5b}

    @classmethod
    def load(cls, path: str, **kwargs) -> VLMAdapter:
        model_type = read_model_type(path)
        if model_type == "llava":
            return LlavaHybridAdapter.load(path, **kwargs)
        if model_type != "qwen2_5_vl":
            raise ValueError(f"{path}: a hybrid checkpoint has model_type qwen2_5_vl or llava, not {model_type!r}")
        return super().load(path, **kwargs)

    @classmethod
    def tiny(cls, seed: int = 0) -> "HybridAdapter":
        vision_donor = Qwen2_5_VLAdapter.tiny(seed)
        lm, tokenizer = tiny_qwen2_lm(seed + 1, tie=False)  # untied: the tiny twin has all four module groups
        composed = assemble_qwen(vision_donor.model, vision_donor.processor, lm, tokenizer, seed=seed)
        return cls(composed.model, composed.processor, source=f"tiny:{cls.family}")


class LlavaHybridAdapter(VLMAdapter):
    family = "hybrid_llava"
    model_types = ("llava",)
    model_class = LlavaForConditionalGeneration
    module_patterns = LLAVA_STYLE_GROUPS
    presets = {"shapes_tiny_init": _build_shapes_tiny_init}

    @classmethod
    def tiny(cls, seed: int = 0) -> "LlavaHybridAdapter":
        vision_cfg = SiglipVisionConfig(**TINY_SIGLIP)
        with seeded(seed):
            vision = SiglipVisionModel(vision_cfg).eval()
        size = {"height": vision_cfg.image_size, "width": vision_cfg.image_size}
        lm, tokenizer = tiny_qwen2_lm(seed + 1, tie=False)
        composed = assemble_llava(vision, SiglipImageProcessor(size=size), lm, tokenizer, seed=seed)
        return cls(composed.model, composed.processor, source=f"tiny:{cls.family}")

    @property
    def tokens_per_image(self) -> int:
        """Image features per image, from the vision config (not the prompt), so tampering is caught."""
        cfg = self.model.config
        vision = cfg.vision_config
        n = (vision.image_size // vision.patch_size) ** 2
        if vision.model_type.startswith("clip"):
            n += 1  # the CLS token
        if cfg.vision_feature_select_strategy == "default":
            n -= 1  # ... which "default" drops
        return n

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            mm["pixel_values"] = features["pixel_values"]  # [n_images, 3, H, W], fixed size
            mm_rows["pixel_values"] = [len(s) for s in images]
        return self._batch(features, images, mm, mm_rows)

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        if "pixel_values" not in batch.mm:
            return [0] * len(batch)
        return [n * self.tokens_per_image for n in batch.mm_rows["pixel_values"]]

    def _group_runs(self, runs, n_images):
        # No delimiters around LLaVA images: adjacent images form one run, so cut runs per image.
        k = self.tokens_per_image
        spans = []
        for start, end in runs:
            spans.extend((s, min(s + k, end)) for s in range(start, end, k))
        return spans

    def completion_inputs(self, batch, completion_ids, completion_mask):
        # generate() derives positions from the attention mask; a plain forward counts pads unless told.
        inputs = super().completion_inputs(batch, completion_ids, completion_mask)
        mask = inputs["attention_mask"].long()
        inputs["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        return inputs

    # ---------------------------------------------------------------- attention-map layout
    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(side, side) patches of the vision tower's square input (same for every image)."""
        vision = self.model.config.vision_config
        side = vision.image_size // vision.patch_size
        return side, side

    def covered_box(self, image_size: tuple[int, int] | None) -> tuple[float, float, float, float]:
        """(y0, x0, y1, x1) of the original image the patch grid sees: all of it when the processor resizes
        to a square (SigLIP); the central crop when it resizes the shortest edge and crops (CLIP)."""
        ip = self.processor.image_processor
        if not getattr(ip, "do_center_crop", False) or image_size is None:
            return 0.0, 0.0, 1.0, 1.0
        h, w = image_size
        short = (ip.size or {}).get("shortest_edge")
        scale = short / min(h, w) if short else 1.0
        rh, rw = h * scale, w * scale
        ch, cw = min(ip.crop_size["height"], rh), min(ip.crop_size["width"], rw)
        y0, x0 = (rh - ch) / 2 / rh, (rw - cw) / 2 / rw
        return y0, x0, y0 + ch / rh, x0 + cw / rw

    def image_token_positions(self, batch, sample, image, image_size=None):
        """The square patch grid row-major; a CLS token kept by the feature strategy (first) has no place."""
        rows, cols = self.image_grid(batch, sample, image)
        tokens = self.image_token_indices(batch, sample, image)
        return grid_cells(tokens[len(tokens) - rows * cols :], rows, cols, self.covered_box(image_size))


register(HybridAdapter)
register(LlavaHybridAdapter)
