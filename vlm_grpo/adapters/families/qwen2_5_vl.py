"""Qwen2.5-VL: flat patch rows + image_grid_thw, and M-RoPE token types over the completion."""

from __future__ import annotations

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sample_rows, sum_per_sample
from vlm_grpo.adapters.image_layout import OneGridLayout, grid_cells
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.qwen2_5_vl import Qwen2_5_VLTwin

QWEN_LAYOUT = ModuleLayout(
    vision=(r"model\.visual\.(?!merger\.)",),
    projector=(r"model\.visual\.merger\.",),
    language=(r"model\.language_model\.",),
)


class Qwen2_5_VLAdapter(Qwen2_5_VLTwin, OneGridLayout, VLMAdapter):
    family = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    model_class = Qwen2_5_VLForConditionalGeneration
    config_class = Qwen2_5_VLConfig
    module_layout = QWEN_LAYOUT
    takes_video = True
    pixel_keys = (*VLMAdapter.pixel_keys, "pixel_values_videos")
    video_keys = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    video_encoder_keys = ("pixel_values_videos", "video_grid_thw")

    def _extra_suppressed_ids(self) -> list[int]:
        cfg = self.model.config
        return [cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]

    @property
    def merge_size(self) -> int:
        return self.model.config.vision_config.spatial_merge_size

    @property
    def video_token_id(self) -> int:
        return self.model.config.video_token_id

    def _to_batch(self, features, images, videos=None) -> PromptBatch:
        mm, mm_rows = {}, {}
        for kind, pixels, grid, items in (("image", "pixel_values", "image_grid_thw", images),
                                          ("video", "pixel_values_videos", "video_grid_thw", videos or [])):
            if pixels in features:  # flat patch rows + one (t, h, w) grid row per image or video
                per_sample = [len(s) for s in items]
                mm[pixels], mm[grid] = features[pixels], features[grid]
                mm_rows[pixels] = sum_per_sample(features[grid].prod(dim=1).tolist(), per_sample)
                mm_rows[grid] = per_sample
                if kind == "video" and "second_per_grid_ts" in features:  # Qwen2.5-VL: seconds per temporal patch
                    mm["second_per_grid_ts"], mm_rows["second_per_grid_ts"] = features["second_per_grid_ts"], per_sample
        token_keys = ()
        if "mm_token_type_ids" in features:
            # M-RoPE positions are built from these; without them the model falls back to 1-D positions.
            mm["mm_token_type_ids"] = features["mm_token_type_ids"]
            mm_rows["mm_token_type_ids"] = [1] * len(images)
            token_keys = ("mm_token_type_ids",)
        return self._batch(features, images, mm, mm_rows, token_keys, videos=videos)

    def _grid_tokens(self, batch: PromptBatch, grid: str) -> list[int]:
        if grid not in batch.mm:
            return [0] * len(batch)
        per_item = (batch.mm[grid].prod(dim=1) // self.merge_size**2).tolist()
        return sum_per_sample(per_item, batch.mm_rows[grid])

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        return self._grid_tokens(batch, "image_grid_thw")

    def video_feature_counts(self, batch: PromptBatch) -> list[int]:
        return self._grid_tokens(batch, "video_grid_thw")

    def video_units(self, batch, videos):
        """Temporal patches (temporal_patch_size frames each) per video, from video_grid_thw."""
        return [sample_rows(batch, "video_grid_thw", i)[:, 0].tolist() for i in range(len(batch.mm_rows["video_grid_thw"]))]

    def video_unit_cells(self, batch, sample, video, unit):
        """A temporal patch's merged patches, row-major over the frame."""
        _, h, w = sample_rows(batch, "video_grid_thw", sample)[video].tolist()
        return grid_cells(self.video_token_indices(batch, sample, video, unit), h // self.merge_size, w // self.merge_size)

    # ---------------------------------------------------------------- sharing hooks (M-RoPE)
    def _rope_index(self, inputs: dict, core) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(3-D positions, per-row rope delta) the model's own rope index gives; None without images."""
        if not {"image_grid_thw", "video_grid_thw"} & set(inputs) or "mm_token_type_ids" not in inputs:
            return None
        timing = {"second_per_grid_ts": inputs["second_per_grid_ts"]} if "second_per_grid_ts" in inputs else {}
        return core.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs.get("image_grid_thw"),
            video_grid_thw=inputs.get("video_grid_thw"), attention_mask=inputs["attention_mask"], **timing,
        )

    def shared_position_ids(self, full_inputs, core):
        # An inputs_embeds forward cannot rebuild M-RoPE positions: give it those of the rope index.
        index = self._rope_index(full_inputs, core)
        return None if index is None else index[0]

    def expand_generation_state(self, prefix, repeats, core):
        # generate() continues from a filled cache with positions = text positions + model.rope_deltas.
        index = self._rope_index(self.model_inputs(prefix), core)
        deltas = torch.zeros(len(prefix), 1, dtype=torch.long, device=prefix.input_ids.device) if index is None else index[1]
        core.model.rope_deltas = deltas.repeat_interleave(repeats, dim=0)

    def vision_call_images(self, args, kwargs):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        return int(grid.shape[0]) if isinstance(grid, torch.Tensor) else 0

    # ---------------------------------------------------------------- attention-map layout
    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(rows, cols) of the merged-patch grid the image's tokens are laid out on."""
        _, h, w = sample_rows(batch, "image_grid_thw", sample)[image].tolist()
        return h // self.merge_size, w // self.merge_size
