"""SmolVLM: Idefics3's tiled layout with SmolLM2 text and SigLIP vision, and video.

A video becomes its frames laid out as images (each one global tile, `<global-img>` and the image tokens after a
"Frame from MM:SS:" timestamp the processor writes from the frame rate), so frames share the image placeholder
and the image encoder. The video tensors hold one row per video (its frames as tiles, zero tiles padding shorter
videos), not one per sample. transformers' processor returns image and video pixels under the same name, so one
call cannot hold both: a batch mixing images and videos is refused.
"""

from __future__ import annotations

from transformers import (
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessor,
    SmolVLMProcessor,
    SmolVLMVideoProcessor,
)

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.families.idefics3 import IMAGE_LAYOUT_TOKENS, TiledImageAdapter, TiledSpec

# Public architecture of HuggingFaceTB/SmolVLM-256M-Instruct (SigLIP-base/16 at 512 px + SmolLM2-135M):
# (512/16)^2 / 4^2 = 64 tokens per tile.
SMOLVLM_256M = Architecture(
    vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=512,
                patch_size=16),
    text=dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    image=dict(scale_factor=4, longest_edge=2048, max_image_size=512),
    vocab_size=49280,
    note="HuggingFaceTB/SmolVLM-256M-Instruct",
)


class SmolVLMAdapter(TiledImageAdapter):
    family = "smolvlm"
    model_types = ("smolvlm",)
    model_class = SmolVLMForConditionalGeneration
    presets = {"smolvlm_256m": SMOLVLM_256M}
    spec = TiledSpec(
        config_cls=SmolVLMConfig,
        processor_cls=SmolVLMProcessor,
        image_processor_cls=SmolVLMImageProcessor,
        # SmolLM2's first ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (the pad token).
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_LAYOUT_TOKENS],
        prefix="<|im_start|>",
        pad_token="<|im_end|>",
        video_processor_cls=SmolVLMVideoProcessor,
    )

    takes_video = True

    def _run_processor(self, texts, images, videos=None, **text_options):
        if not videos or not any(videos):
            return super()._run_processor(texts, images, **text_options)
        if any(images):
            raise ValueError(f"{self.family}: a batch mixing images and videos cannot be encoded (transformers' SmolVLM "
                             "processor returns both as pixel_values, one overwriting the other); batch them apart")
        clips = [v for sample in videos for v in sample]
        return self.processor(text=texts, videos=[v.frames for v in clips], video_metadata=[v.metadata() for v in clips],
                              do_sample_frames=False, padding=True, return_tensors="pt", **text_options)

    def _to_batch(self, features, images, videos=None):
        if not videos or not any(videos):
            return super()._to_batch(features, images)
        per_sample = [len(s) for s in videos]  # one row of frame tiles per video
        mm = {"pixel_values": features["pixel_values"], "pixel_attention_mask": features["pixel_attention_mask"].bool()}
        return self._batch(features, images, mm, dict.fromkeys(mm, per_sample), videos=videos)
