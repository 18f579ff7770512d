"""GLM-4.1V: Qwen2-VL's image layout (flat 14-px patch rows + image_grid_thw, 2x2 merges, M-RoPE built from the
processor's `mm_token_type_ids`) with GLM's own parts: the vision tower's learned position table interpolated to
each image's grid, a convolution that merges 2x2 patches before a gated MLP merger, a GLM-4 language model (fused
gate/up projection, partial rotary embedding) and GLM's chat format (`[gMASK]<sop>`, `<|user|>`, `<|assistant|>`).

Everything the Qwen2.5-VL adapter does with the rope index (positions of a features forward, rope deltas after a
shared prefill) holds unchanged: `Glm4vModel.get_rope_index` takes the same arguments.
"""

from __future__ import annotations

from transformers import Glm4vConfig, Glm4vForConditionalGeneration

from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.glm4v import Glm4vTwin

LAYOUT = ModuleLayout(
    vision=(r"model\.visual\.(?!merger\.)(?!downsample\.)",),  # no `|`: it would split the README table
    # the 2x2 patch-merging convolution and the gated MLP merger take patches into the language model's width
    projector=(r"model\.visual\.downsample\.", r"model\.visual\.merger\."),
    language=(r"model\.language_model\.",),
)


class Glm4vAdapter(Glm4vTwin, Qwen2_5_VLAdapter):
    family = "glm4v"
    model_types = ("glm4v",)
    model_class = Glm4vForConditionalGeneration
    config_class = Glm4vConfig
    module_layout = LAYOUT
    # GLM-4.1V's processor lays a video out as timestamped image-token frames inside <|begin_of_video|> ... which the
    # video hooks do not map yet: video rows are refused by name (images, several per prompt, work)
    takes_video = False

    def _extra_suppressed_ids(self) -> list[int]:
        cfg = self.model.config
        return [cfg.video_token_id, cfg.image_start_token_id, cfg.image_end_token_id, cfg.video_start_token_id,
                cfg.video_end_token_id]
