"""The Qwen2.5-VL-classes hybrid ("hybrid"): a Qwen2.5-VL ViT + a Qwen2 LM inside the Qwen2.5-VL classes (the
pairing of the qwen-0.5b-learns-to-see recipe); once loaded it behaves exactly like Qwen2.5-VL. `--model
hybrid:DIR` also accepts a LLaVA-classes hybrid (hybrid_llava.py).

The pairing lives here: the ViT and the LM load unchanged; only the merger's last linear changes shape. With three
equal M-RoPE position rows the text path is the donor LM's 1-D RoPE, so text logits are preserved.
"""

from __future__ import annotations

import copy

from vlm_grpo.adapters.assembly import (
    Composed, Composer, UnsupportedPairing, cast_state, check_text_logits, load_language, record_dtype, reinit_linear,
    tokenizer_with,
)
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.families.hybrid_llava import LlavaHybridAdapter
from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.model_dirs import read_model_type
from vlm_grpo.adapters.seeding import default_dtype, seeded
from vlm_grpo.adapters.twins.hybrid import HybridTwin, mrope_section
from vlm_grpo.adapters.twins.qwen2_5_vl import QWEN_CHAT_TEMPLATE, qwen_token_ids

QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_LM_TYPES = ("qwen2",)


class HybridAdapter(HybridTwin, Composer, Qwen2_5_VLAdapter):
    family = "hybrid"
    model_types = ()  # a composed checkpoint says qwen2_5_vl (or llava): bare paths go to those adapters
    model_types_note = "(via `hybrid:DIR`)"
    vision_donor_types = ("qwen2_5_vl",)
    pairing = "vision qwen2_5_vl (Qwen2.5-VL checkpoint) + LM qwen2 (Qwen2/Qwen2.5 causal LM) -> Qwen2.5-VL classes"

    @classmethod
    def load(cls, path: str, **kwargs) -> VLMAdapter:
        model_type = read_model_type(path)
        if model_type == "llava":
            return LlavaHybridAdapter.load(path, **kwargs)
        if model_type != "qwen2_5_vl":
            raise ValueError(f"{path}: a hybrid checkpoint has model_type qwen2_5_vl or llava, not {model_type!r}")
        return super().load(path, **kwargs)

    @classmethod
    def check_lm_donor(cls, vision_type, lm_type):
        if lm_type not in QWEN_LM_TYPES:
            raise UnsupportedPairing(
                f"a {vision_type} vision tower pairs only with a Qwen2 LM (model_type qwen2), got {lm_type!r}. "
                f"Supported: {cls.pairing}"
            )

    @classmethod
    def assemble_from(cls, vision_name, lm, lm_tokenizer, seed, load_donor):
        donor = load_donor()
        return assemble_qwen(donor.model, donor.processor, lm, lm_tokenizer, seed)


def assemble_qwen(vl_model, vl_processor, lm, lm_tokenizer, seed: int = 0) -> Composed:
    """Qwen2.5-VL vision tower (with merger) + Qwen2 causal LM inside Qwen2_5_VLForConditionalGeneration."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    HybridAdapter.check_lm_donor(vl_model.config.model_type, lm.config.model_type)
    notes: list[str] = []
    tokenizer = tokenizer_with(lm_tokenizer, QWEN_VISION_TOKENS, notes)
    lm_cfg = lm.config
    vocab = max(lm_cfg.vocab_size, len(tokenizer))
    width = lm_cfg.hidden_size
    vision_cfg = copy.deepcopy(vl_model.config.vision_config)
    donor_width = vision_cfg.out_hidden_size
    vision_cfg.out_hidden_size = width
    config = Qwen2_5_VLConfig(
        text_config=_qwen_text_config(lm_cfg, vocab),
        vision_config=vision_cfg.to_dict(),
        tie_word_embeddings=bool(lm_cfg.tie_word_embeddings),
        **qwen_token_ids(tokenizer),
    )
    dtype = lm.dtype
    record_dtype(config, dtype)
    with seeded(seed), default_dtype(dtype):
        model = Qwen2_5_VLForConditionalGeneration(config)

    visual_sd = {k: v for k, v in vl_model.model.visual.state_dict().items()}
    if donor_width != width:
        # The merger's last linear maps into the LM's embedding space: a new width needs a new layer.
        visual_sd = {k: v for k, v in visual_sd.items() if not k.startswith("merger.mlp.2.")}
        notes.append(f"merger.mlp.2 re-initialised: {donor_width} -> {width} (seed {seed})")
    missing, unexpected = model.model.visual.load_state_dict(cast_state(visual_sd, dtype), strict=False)
    if unexpected or any(not k.startswith("merger.mlp.2.") for k in missing):
        raise RuntimeError(f"vision tower did not load: missing {missing}, unexpected {unexpected}")
    if missing:
        reinit_linear(model.model.visual.merger.mlp[2], seed, config.vision_config.initializer_range)

    load_language(model.model.language_model, model.lm_head, lm, vocab, tied=config.tie_word_embeddings)
    model.generation_config = copy.deepcopy(lm.generation_config)
    template = getattr(vl_processor, "chat_template", None) or QWEN_CHAT_TEMPLATE
    tokenizer.chat_template = template
    processor = Qwen2_5_VLProcessor(
        image_processor=copy.deepcopy(vl_processor.image_processor),
        tokenizer=tokenizer,
        video_processor=copy.deepcopy(vl_processor.video_processor),
        chat_template=template,
    )
    model.eval()
    notes.append(f"text-only logits equal the donor LM's: max |diff| {check_text_logits(model, lm, tokenizer):.3g}")
    return Composed(model, processor, notes)


def _qwen_text_config(lm_cfg, vocab: int) -> dict:
    heads = lm_cfg.num_attention_heads
    head_dim = lm_cfg.hidden_size // heads
    if getattr(lm_cfg, "head_dim", None) not in (None, head_dim):
        raise UnsupportedPairing(f"LM head_dim {lm_cfg.head_dim} != hidden/heads; Qwen2.5-VL assumes hidden/heads")
    rope = dict(lm_cfg.rope_parameters or {"rope_type": "default", "rope_theta": 1e6})
    rope["mrope_section"] = mrope_section(head_dim)
    keys = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps", "use_sliding_window",
        "sliding_window", "max_window_layers", "layer_types", "attention_dropout", "bos_token_id", "eos_token_id",
        "pad_token_id",
    )
    text = {k: getattr(lm_cfg, k) for k in keys if getattr(lm_cfg, k, None) is not None}
    return {**text, "vocab_size": vocab, "rope_parameters": rope, "tie_word_embeddings": bool(lm_cfg.tie_word_embeddings)}
