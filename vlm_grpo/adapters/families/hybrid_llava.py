"""The LLaVA-classes hybrid ("hybrid_llava"): a SigLIP/CLIP vision tower + any causal LM inside
LlavaForConditionalGeneration with a fresh projector (`vlm-grpo compose --vision SIGLIP_OR_CLIP --llm LM`).

The pairing lives here: which vision donors it takes, the assembly, the chat template (ChatML, keeping the LM's own
default system turn), and the donor's image processor (its own, or SigLIP's/CLIP's default at its size).
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import LlavaForConditionalGeneration, SiglipImageProcessor

from vlm_grpo.adapters.assembly import (
    Composed, Composer, UnsupportedPairing, cast_state, check_image_size, check_text_logits, load_language,
    record_dtype, reinit_linear, tokenizer_with, vision_part,
)
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.chat_templates import DEFAULT_SYSTEM, NotChatML, chatml_default_system, chatml_template
from vlm_grpo.adapters.features import with_mask_positions
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.seeding import default_dtype, seeded
from vlm_grpo.adapters.twins.hybrid_llava import LlavaHybridTwin

IMAGE_TOKEN = "<image>"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
# ChatML with one <image> placeholder per image part (the LLaVA processor expands it per patch); the default
# system turn is the LM donor's own when its template is ChatML (llava_chat_template).
LLAVA_CHAT_TEMPLATE = chatml_template(IMAGE_TOKEN)


class LlavaHybridAdapter(LlavaHybridTwin, Composer, VLMAdapter):
    family = "hybrid_llava"
    model_types = ("llava",)
    model_class = LlavaForConditionalGeneration
    module_layout = LLAVA_STYLE
    vision_donor_types = ("siglip", "siglip_vision_model", "clip", "clip_vision_model")
    pairing = "vision siglip/siglip_vision_model/clip/clip_vision_model + any causal LM -> LLaVA classes"

    @classmethod
    def assemble_from(cls, vision_name, lm, lm_tokenizer, seed, load_donor):
        from transformers import AutoModel

        vision = vision_part(AutoModel.from_pretrained(vision_name, dtype="auto", trust_remote_code=False))
        return cls.assemble(vision, image_processor(vision_name, vision.config), lm, lm_tokenizer, seed)

    @classmethod
    def assemble(cls, vision, image_processor, lm, lm_tokenizer, seed: int = 0) -> Composed:
        """The hybrid of loaded donors: real ones after `assemble_from` loads them, random ones in the twin."""
        return assemble_llava(vision, image_processor, lm, lm_tokenizer, seed)

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


def assemble_llava(vision, image_processor, lm, lm_tokenizer, seed: int = 0) -> Composed:
    """SigLIP/CLIP vision model + any causal LM inside LlavaForConditionalGeneration, fresh projector."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    vision = vision_part(vision)
    vtype = vision.config.model_type
    if vtype not in ("siglip_vision_model", "clip_vision_model"):
        raise UnsupportedPairing(f"LLaVA pairing needs a SigLIP/CLIP vision model, got {vtype!r}. Supported: {LlavaHybridAdapter.pairing}")
    siglip = vtype == "siglip_vision_model"
    notes: list[str] = []
    vision_cfg = copy.deepcopy(vision.config)
    if siglip:
        # The pooling head would get no gradient (DDP's unused-parameter check fails); and tying the last
        # hidden state makes LLaVA read the post-layernorm output, so post_layernorm is trained too.
        vision_cfg.vision_use_head = False
        vision_cfg.tie_last_hidden_states = True
    tokenizer = tokenizer_with(lm_tokenizer, (IMAGE_TOKEN, *CHATML_TOKENS), notes)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        notes.append(f"pad token set to eos {tokenizer.eos_token!r}")
    lm_cfg = lm.config
    vocab = max(lm_cfg.vocab_size, len(tokenizer))
    text_cfg = copy.deepcopy(lm_cfg)
    text_cfg.vocab_size = vocab
    strategy = "full" if siglip else "default"  # "default" drops CLIP's CLS token
    patches = (vision_cfg.image_size // vision_cfg.patch_size) ** 2
    config = LlavaConfig(
        vision_config=vision_cfg,
        text_config=text_cfg,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=patches,
        vision_feature_select_strategy=strategy,
        vision_feature_layer=-1,  # every vision layer gets a gradient
        projector_hidden_act="gelu",
        tie_word_embeddings=bool(lm_cfg.tie_word_embeddings),
    )
    dtype = lm.dtype
    record_dtype(config, dtype)
    with seeded(seed), default_dtype(dtype):
        model = LlavaForConditionalGeneration(config)
    vision_sd = {k: v for k, v in vision.state_dict().items() if not k.startswith("head.")}
    model.model.vision_tower.load_state_dict(cast_state(vision_sd, dtype), strict=True)
    projector = model.model.multi_modal_projector
    reinit_linear(projector.linear_1, seed, lm_cfg.initializer_range)
    reinit_linear(projector.linear_2, seed + 1, lm_cfg.initializer_range)
    load_language(model.model.language_model, model.lm_head, lm, vocab, tied=config.tie_word_embeddings)

    model.generation_config = copy.deepcopy(lm.generation_config)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = sorted({*eos, im_end, tokenizer.eos_token_id})  # the template ends turns with <|im_end|>
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    template = llava_chat_template(lm_tokenizer, notes)
    tokenizer.chat_template = template
    check_image_size(image_processor, vision_cfg.image_size)
    processor = LlavaProcessor(
        image_processor=copy.deepcopy(image_processor),
        tokenizer=tokenizer,
        patch_size=vision_cfg.patch_size,
        vision_feature_select_strategy=strategy,
        chat_template=template,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=0 if siglip else 1,
    )
    model.eval()
    notes.append(f"text-only logits equal the donor LM's: max |diff| {check_text_logits(model, lm, tokenizer):.3g}")
    return Composed(model, processor, notes)


def llava_chat_template(lm_tokenizer, notes: list[str]) -> str:
    """ChatML with image parts, opening with the system turn the LM was tuned with: an instruct LM's template
    often writes a default system message (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."), and
    the hybrid's text-only prompts should read as the LM's own do."""
    try:
        return chatml_template(IMAGE_TOKEN, default_system=chatml_default_system(lm_tokenizer))
    except NotChatML as err:
        notes.append(f"the LM's chat template is not ChatML ({err}); the hybrid writes ChatML with the "
                     f"default system turn {DEFAULT_SYSTEM!r}")
        return LLAVA_CHAT_TEMPLATE


def image_processor(vision_src: str, vision_config) -> Any:
    """The vision checkpoint's own image processor, or the family's default at its size when it has none."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(vision_src, trust_remote_code=False)  # compose checked its code
    except (OSError, ValueError):
        return default_image_processor(vision_config)


def default_image_processor(vision_config) -> Any:
    size = {"height": vision_config.image_size, "width": vision_config.image_size}
    if vision_config.model_type.startswith("siglip"):
        return SiglipImageProcessor(size=size)
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": vision_config.image_size}, crop_size=size)
