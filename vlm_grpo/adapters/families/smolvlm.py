"""SmolVLM: Idefics3's tiled layout with SmolLM2 text and SigLIP vision, and video.

A video becomes its frames laid out as images (each one global tile, `<global-img>` and the image tokens after a
"Frame from MM:SS:" timestamp the processor writes from the frame rate), so frames share the image placeholder
and the image encoder. The video tensors hold one row per video (its frames as tiles, zero tiles padding shorter
videos), not one per sample. transformers' processor returns image and video pixels under the same name, so one
call cannot hold both: a batch mixing images and videos is refused.
"""

from __future__ import annotations

from transformers import SmolVLMForConditionalGeneration

from vlm_grpo.adapters.families.idefics3 import TiledImageAdapter
from vlm_grpo.adapters.twins.smolvlm import SmolVLMTwin


class SmolVLMAdapter(SmolVLMTwin, TiledImageAdapter):
    family = "smolvlm"
    model_types = ("smolvlm",)
    model_class = SmolVLMForConditionalGeneration
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
