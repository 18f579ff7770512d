"""Assembling a hybrid VLM from an in-memory vision donor and language donor: what every pairing shares.

A family that composes hybrids (families/hybrid.py: Qwen2.5-VL classes; families/hybrid_llava.py: LLaVA classes)
declares the vision donors it takes (`vision_donor_types`), says which LMs pair with them (`check_lm_donor`) and
assembles (`assemble_from`); `vlm_grpo.compose` finds that family through the registry by the vision donor's
`model_type`. The pieces here name no family: the result record, the LM donor's tokenizer with added tokens, the
strict load of the LM's weights (rows for added tokens at the mean embedding), re-initialised layers, and the
check that text-only logits equal the donor LM's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from tokenizers import AddedToken


class UnsupportedPairing(ValueError):
    """The two donors cannot be composed by any supported pairing."""


@dataclass
class Composed:
    model: torch.nn.Module
    processor: Any
    notes: list[str] = field(default_factory=list)  # what compose had to change, for the user


class Composer:
    """Mixed into a family adapter that assembles hybrids from donors."""

    vision_donor_types: ClassVar[tuple[str, ...]] = ()  # `model_type` values of the vision donors it takes
    pairing: ClassVar[str] = ""  # one line for the user: which donors, which classes

    @classmethod
    def check_lm_donor(cls, vision_type: str, lm_type: str) -> None:
        """Raise UnsupportedPairing when an LM of `lm_type` cannot pair with this vision donor (before loading)."""

    @classmethod
    def assemble_from(cls, vision_name: str, lm, lm_tokenizer, seed: int, load_donor: Callable[[], Any]) -> Composed:
        """The hybrid of the vision donor (`vision_name`: its directory or hub id; `load_donor()`: it as a loaded
        adapter, for donors that are whole VLMs) and the LM."""
        raise NotImplementedError


def vision_part(model: torch.nn.Module) -> torch.nn.Module:
    # A full CLIP/SigLIP model keeps its vision side as `.vision_model` (a *VisionModel).
    return getattr(model, "vision_model", model)


def tokenizer_with(lm_tokenizer, tokens, notes: list[str]):
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


def load_language(target_base, target_head, lm, vocab: int, *, tied: bool) -> None:
    """Load the donor LM strictly; rows for added tokens start at the mean embedding (no RNG needed)."""
    base = getattr(lm, lm.base_model_prefix)
    state = dict(base.state_dict())
    embed_ptr = base.get_input_embeddings().weight.data_ptr()
    embed_key = next(k for k, v in state.items() if v.data_ptr() == embed_ptr)
    state[embed_key] = grow_rows(state[embed_key], vocab)
    dtype = target_head.weight.dtype
    target_base.load_state_dict(cast_state(state, dtype), strict=True)
    if not tied:
        head = lm.get_output_embeddings()
        with torch.no_grad():
            target_head.weight.copy_(grow_rows(head.weight.detach(), vocab))
            if getattr(head, "bias", None) is not None or getattr(target_head, "bias", None) is not None:
                raise UnsupportedPairing("LM heads with a bias are not supported")
    elif target_head.weight.data_ptr() != target_base.get_input_embeddings().weight.data_ptr():
        with torch.no_grad():  # tying failed silently: copy so the logits still match the donor
            target_head.weight.copy_(target_base.get_input_embeddings().weight)


def grow_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] >= rows:
        return weight
    extra = weight.float().mean(dim=0, keepdim=True).to(weight.dtype).expand(rows - weight.shape[0], -1)
    return torch.cat([weight, extra], dim=0)


def reinit_linear(linear: torch.nn.Linear, seed: int, std: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(linear.weight.shape, generator=gen) * std
        linear.weight.copy_(weight.to(linear.weight.dtype))
        if linear.bias is not None:
            linear.bias.zero_()


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def record_dtype(config, dtype: torch.dtype) -> None:
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


def check_image_size(image_processor, image_size: int) -> None:
    from PIL import Image

    pixels = image_processor(images=[Image.new("RGB", (37, 23))], return_tensors="pt")["pixel_values"]
    if tuple(pixels.shape[-2:]) != (image_size, image_size):
        raise ValueError(
            f"the image processor makes {tuple(pixels.shape[-2:])} images but the vision model expects "
            f"{image_size}x{image_size}"
        )
