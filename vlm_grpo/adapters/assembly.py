"""Assembling a hybrid VLM from an in-memory vision donor and language donor.

Two pairings, dispatched on the vision donor's `config.model_type`:
- Qwen2.5-VL vision tower + a Qwen2 causal LM, assembled in the Qwen2.5-VL classes (the pairing of the
  qwen-0.5b-learns-to-see recipe). The ViT and the LM load unchanged; only the merger's last linear changes
  shape. With three equal M-RoPE position rows the text path is the donor LM's 1-D RoPE, so text logits are
  preserved.
- SigLIP/CLIP vision model + any causal LM, assembled in the LLaVA classes with a fresh projector.

Tiny twins use these directly; `vlm_grpo.compose` adds loading the donors and saving the result.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import AddedToken

from vlm_grpo.adapters.chat_templates import DEFAULT_SYSTEM, NotChatML, chatml_default_system, chatml_template
from vlm_grpo.adapters.families.qwen2_5_vl import QWEN_CHAT_TEMPLATE, qwen_token_ids
from vlm_grpo.adapters.seeding import default_dtype, seeded

QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_VISION_TYPES = ("qwen2_5_vl",)
QWEN_LM_TYPES = ("qwen2",)
LLAVA_VISION_TYPES = ("siglip", "siglip_vision_model", "clip", "clip_vision_model")
IMAGE_TOKEN = "<image>"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
SUPPORTED = (
    "vision qwen2_5_vl (Qwen2.5-VL checkpoint) + LM qwen2 (Qwen2/Qwen2.5 causal LM) -> Qwen2.5-VL classes; "
    "vision siglip/siglip_vision_model/clip/clip_vision_model + any causal LM -> LLaVA classes"
)

# ChatML with one <image> placeholder per image part (the LLaVA processor expands it per patch); the default
# system turn is the LM donor's own when its template is ChatML (llava_chat_template).
LLAVA_CHAT_TEMPLATE = chatml_template(IMAGE_TOKEN)


class UnsupportedPairing(ValueError):
    """The two donors cannot be composed by any supported pairing."""


@dataclass
class Composed:
    model: torch.nn.Module
    processor: Any
    notes: list[str] = field(default_factory=list)  # what compose had to change, for the user


def check_pairing(vision_type: str, lm_type: str) -> None:
    if vision_type in QWEN_VISION_TYPES:
        if lm_type not in QWEN_LM_TYPES:
            raise UnsupportedPairing(
                f"a {vision_type} vision tower pairs only with a Qwen2 LM (model_type qwen2), got {lm_type!r}. "
                f"Supported: {SUPPORTED}"
            )
    elif vision_type not in LLAVA_VISION_TYPES:
        raise UnsupportedPairing(f"unsupported vision source model_type {vision_type!r}. Supported: {SUPPORTED}")


def vision_part(model: torch.nn.Module) -> torch.nn.Module:
    # A full CLIP/SigLIP model keeps its vision side as `.vision_model` (a *VisionModel).
    return getattr(model, "vision_model", model)


# ---------------------------------------------------------------------------- Qwen2.5-VL classes
def assemble_qwen(vl_model, vl_processor, lm, lm_tokenizer, seed: int = 0) -> Composed:
    """Qwen2.5-VL vision tower (with merger) + Qwen2 causal LM inside Qwen2_5_VLForConditionalGeneration."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    check_pairing(vl_model.config.model_type, lm.config.model_type)
    notes: list[str] = []
    tokenizer = _tokenizer_with(lm_tokenizer, QWEN_VISION_TOKENS, notes)
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
    _record_dtype(config, dtype)
    with seeded(seed), default_dtype(dtype):
        model = Qwen2_5_VLForConditionalGeneration(config)

    visual_sd = {k: v for k, v in vl_model.model.visual.state_dict().items()}
    if donor_width != width:
        # The merger's last linear maps into the LM's embedding space: a new width needs a new layer.
        visual_sd = {k: v for k, v in visual_sd.items() if not k.startswith("merger.mlp.2.")}
        notes.append(f"merger.mlp.2 re-initialised: {donor_width} -> {width} (seed {seed})")
    missing, unexpected = model.model.visual.load_state_dict(_cast(visual_sd, dtype), strict=False)
    if unexpected or any(not k.startswith("merger.mlp.2.") for k in missing):
        raise RuntimeError(f"vision tower did not load: missing {missing}, unexpected {unexpected}")
    if missing:
        _reinit_linear(model.model.visual.merger.mlp[2], seed, config.vision_config.initializer_range)

    _load_language(model.model.language_model, model.lm_head, lm, vocab, tied=config.tie_word_embeddings)
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


def mrope_section(head_dim: int) -> list[int]:
    """Temporal/height/width split of the rotary half-dim; Qwen's 128-dim heads use [16, 24, 24]."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


# ---------------------------------------------------------------------------- LLaVA classes
def assemble_llava(vision, image_processor, lm, lm_tokenizer, seed: int = 0) -> Composed:
    """SigLIP/CLIP vision model + any causal LM inside LlavaForConditionalGeneration, fresh projector."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    vision = vision_part(vision)
    vtype = vision.config.model_type
    if vtype not in ("siglip_vision_model", "clip_vision_model"):
        raise UnsupportedPairing(f"LLaVA pairing needs a SigLIP/CLIP vision model, got {vtype!r}. Supported: {SUPPORTED}")
    siglip = vtype == "siglip_vision_model"
    notes: list[str] = []
    vision_cfg = copy.deepcopy(vision.config)
    if siglip:
        # The pooling head would get no gradient (DDP's unused-parameter check fails); and tying the last
        # hidden state makes LLaVA read the post-layernorm output, so post_layernorm is trained too.
        vision_cfg.vision_use_head = False
        vision_cfg.tie_last_hidden_states = True
    tokenizer = _tokenizer_with(lm_tokenizer, (IMAGE_TOKEN, *CHATML_TOKENS), notes)
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
    _record_dtype(config, dtype)
    with seeded(seed), default_dtype(dtype):
        model = LlavaForConditionalGeneration(config)
    vision_sd = {k: v for k, v in vision.state_dict().items() if not k.startswith("head.")}
    model.model.vision_tower.load_state_dict(_cast(vision_sd, dtype), strict=True)
    projector = model.model.multi_modal_projector
    _reinit_linear(projector.linear_1, seed, lm_cfg.initializer_range)
    _reinit_linear(projector.linear_2, seed + 1, lm_cfg.initializer_range)
    _load_language(model.model.language_model, model.lm_head, lm, vocab, tied=config.tie_word_embeddings)

    model.generation_config = copy.deepcopy(lm.generation_config)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = sorted({*eos, im_end, tokenizer.eos_token_id})  # the template ends turns with <|im_end|>
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    template = llava_chat_template(lm_tokenizer, notes)
    tokenizer.chat_template = template
    _check_image_size(image_processor, vision_cfg.image_size)
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


def _check_image_size(image_processor, image_size: int) -> None:
    from PIL import Image

    pixels = image_processor(images=[Image.new("RGB", (37, 23))], return_tensors="pt")["pixel_values"]
    if tuple(pixels.shape[-2:]) != (image_size, image_size):
        raise ValueError(
            f"the image processor makes {tuple(pixels.shape[-2:])} images but the vision model expects "
            f"{image_size}x{image_size}"
        )


# ---------------------------------------------------------------------------- shared pieces
def _tokenizer_with(lm_tokenizer, tokens, notes: list[str]):
    """A copy of the LM tokenizer carrying `tokens` as single special tokens (added only when missing)."""
    tokenizer = copy.deepcopy(lm_tokenizer)
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if missing:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
        notes.append(f"added tokens missing from the LM tokenizer: {missing}")
    tokenizer.padding_side = "left"  # generation appends on the right
    # ... and saved so: a hub tokenizer (SmolLM2's, Qwen2.5's) defaults to right padding, and the attribute alone
    # is not written, so the checkpoint would pad right wherever it is loaded without our loader (TRL, plain
    # AutoProcessor), shifting left-aligned prompts away from their completions
    tokenizer.init_kwargs["padding_side"] = "left"
    return tokenizer


def _load_language(target_base, target_head, lm, vocab: int, *, tied: bool) -> None:
    """Load the donor LM strictly; rows for added tokens start at the mean embedding (no RNG needed)."""
    base = getattr(lm, lm.base_model_prefix)
    state = dict(base.state_dict())
    embed_ptr = base.get_input_embeddings().weight.data_ptr()
    embed_key = next(k for k, v in state.items() if v.data_ptr() == embed_ptr)
    state[embed_key] = _grow(state[embed_key], vocab)
    dtype = target_head.weight.dtype
    target_base.load_state_dict(_cast(state, dtype), strict=True)
    if not tied:
        head = lm.get_output_embeddings()
        with torch.no_grad():
            target_head.weight.copy_(_grow(head.weight.detach(), vocab))
            if getattr(head, "bias", None) is not None or getattr(target_head, "bias", None) is not None:
                raise UnsupportedPairing("LM heads with a bias are not supported")
    elif target_head.weight.data_ptr() != target_base.get_input_embeddings().weight.data_ptr():
        with torch.no_grad():  # tying failed silently: copy so the logits still match the donor
            target_head.weight.copy_(target_base.get_input_embeddings().weight)


def _grow(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] >= rows:
        return weight
    extra = weight.float().mean(dim=0, keepdim=True).to(weight.dtype).expand(rows - weight.shape[0], -1)
    return torch.cat([weight, extra], dim=0)


def _reinit_linear(linear: torch.nn.Linear, seed: int, std: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(linear.weight.shape, generator=gen) * std
        linear.weight.copy_(weight.to(linear.weight.dtype))
        if linear.bias is not None:
            linear.bias.zero_()


def _cast(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def _record_dtype(config, dtype: torch.dtype) -> None:
    # Donor configs loaded from disk carry their own dtype, which construction would follow; and
    # from_pretrained(dtype="auto") reads the saved config's dtype, not the tensors'.
    for cfg in (config, getattr(config, "text_config", None), getattr(config, "vision_config", None)):
        if cfg is not None:
            cfg.dtype = dtype




def check_text_logits(model, lm, tokenizer, text: str = "There are 3 red circles. The answer is 3.") -> float:
    """Text-only logits over the donor's vocab must equal the donor's: the composition kept the LM intact."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :16]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).logits[..., : lm.config.vocab_size].float()
        ref = lm(input_ids=ids, attention_mask=mask).logits.float()
    diff = (ours - ref).abs().max().item()
    tol = 1e-4 if lm.dtype == torch.float32 else 2e-2 * max(1.0, ref.abs().max().item())
    if diff > tol:
        raise RuntimeError(f"composed text logits differ from the donor LM's by {diff:.3g} (> {tol:.3g})")
    return diff
