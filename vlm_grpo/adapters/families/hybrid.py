"""Hybrid VLMs: a donor vision tower + a donor LM (compose.py assembles real checkpoints).

- `HybridAdapter` ("hybrid"): a Qwen2.5-VL ViT + a Qwen2 LM inside the Qwen2.5-VL classes (the pairing of
  the qwen-0.5b-learns-to-see recipe); once loaded it behaves exactly like Qwen2.5-VL. `--model hybrid:DIR`
  also accepts a LLaVA-classes hybrid.
- `LlavaHybridAdapter` ("hybrid_llava"): SigLIP/CLIP + any causal LM inside the LLaVA classes.
"""

from __future__ import annotations

import torch
from transformers import LlavaForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM, SiglipImageProcessor, \
    SiglipVisionConfig, SiglipVisionModel

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.assembly import assemble_llava, mrope_section
from vlm_grpo.adapters.families.qwen2_5_vl import (
    BENCH_PIXELS, QWEN_VOCAB, REAL_PIXELS, TINY_PIXELS, TINY_VISION, VISION_3B, Qwen2_5_VLAdapter, qwen_rope,
    qwen_tokenizer,
)
from vlm_grpo.adapters.features import with_mask_positions
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.model_dirs import read_model_type
from vlm_grpo.adapters.seeding import seeded

# Deliberately not the tiny Qwen2.5-VL's text width (64), so the merger's output differs from the donor's.
TINY_LM = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
)
TINY_SIGLIP = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
)
# Public architecture of Qwen/Qwen2.5-0.5B, its 64-dim heads split for M-RoPE.
TEXT_0_5B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters=qwen_rope(mrope_section(64)),
)
# The shipped `pretrained:shapes-tiny` before training (`vlm-grpo sft --model preset:shapes_tiny_init`): a LLaVA
# hybrid sized for 64-px shape counting on CPU; weights come from the seed alone, always float32.
SHAPES_TINY_SIGLIP = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8,
)
SHAPES_TINY_LM = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=True,
)


def qwen2_lm(text: dict, seed: int, dtype: torch.dtype = torch.float32) -> tuple[Qwen2ForCausalLM, object]:
    """A random-weight Qwen2 causal LM and its tiny tokenizer: the language donor of the hybrids' twins."""
    tokenizer = qwen_tokenizer()
    text = {"tie_word_embeddings": False, **text}
    config = Qwen2Config(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **text,
    )
    with seeded(seed):
        return Qwen2ForCausalLM(config).to(dtype).eval(), tokenizer


class HybridAdapter(Qwen2_5_VLAdapter):
    family = "hybrid"
    model_types = ()  # a composed checkpoint says qwen2_5_vl (or llava): bare paths go to those adapters
    tiny_architecture = Architecture(
        vision=dict(TINY_VISION, out_hidden_size=TINY_LM["hidden_size"]),
        text=dict(TINY_LM, rope_parameters=qwen_rope(mrope_section(16))),
        image=TINY_PIXELS,
    )
    presets = {
        "hybrid_3b_vit_0_5b": Architecture(
            dict(VISION_3B, out_hidden_size=896), TEXT_0_5B, REAL_PIXELS, QWEN_VOCAB,
            note="Qwen/Qwen2.5-VL-3B-Instruct's ViT + Qwen/Qwen2.5-0.5B",
        ),
        # CPU benchmark: a ViT-heavy hybrid, Qwen ViT 8 x 256 (8.7M) + merger (1.2M) -> a 2-layer, 128-wide LM (0.5M)
        "hybrid_vit_heavy": Architecture(
            vision=dict(TINY_VISION, depth=8, hidden_size=256, intermediate_size=1024, num_heads=4, window_size=112,
                        fullatt_block_indexes=[3, 7], out_hidden_size=128),
            text=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, rope_parameters=qwen_rope([4, 6, 6])),
            image=BENCH_PIXELS,
        ),
    }

    @classmethod
    def load(cls, path: str, **kwargs) -> VLMAdapter:
        model_type = read_model_type(path)
        if model_type == "llava":
            return LlavaHybridAdapter.load(path, **kwargs)
        if model_type != "qwen2_5_vl":
            raise ValueError(f"{path}: a hybrid checkpoint has model_type qwen2_5_vl or llava, not {model_type!r}")
        return super().load(path, **kwargs)


class LlavaHybridAdapter(VLMAdapter):
    family = "hybrid_llava"
    model_types = ("llava",)
    model_class = LlavaForConditionalGeneration
    module_layout = LLAVA_STYLE
    tiny_architecture = Architecture(vision=TINY_SIGLIP, text=TINY_LM)
    presets = {"shapes_tiny_init": Architecture(vision=SHAPES_TINY_SIGLIP, text=SHAPES_TINY_LM)}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        vision_cfg = SiglipVisionConfig(**arch.vision)
        with seeded(seed):
            vision = SiglipVisionModel(vision_cfg).to(dtype).eval()
        lm, tokenizer = qwen2_lm(dict(arch.text), seed + 1, dtype)
        size = {"height": vision_cfg.image_size, "width": vision_cfg.image_size}
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
        return [(s, min(s + k, end)) for start, end in runs for s in range(start, end, k)]

    def completion_inputs(self, batch, completion_ids, completion_mask, completion_types=None):
        # generate() derives positions from the attention mask; a plain forward counts pads unless told.
        return with_mask_positions(super().completion_inputs(batch, completion_ids, completion_mask, completion_types))

    # ---------------------------------------------------------------- attention-map layout
    def layout_facts(self, batch, sample, image):
        side = batch.mm["pixel_values"].shape[-1] // self.model.config.vision_config.patch_size
        return LayoutFacts(tiles=1, grid=(side, side))

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
        vision = self.model.config.vision_config
        side = vision.image_size // vision.patch_size
        tokens = self.image_token_indices(batch, sample, image)
        return grid_cells(tokens[len(tokens) - side * side :], side, side, self.covered_box(image_size))
