"""The adapter interface: everything the GRPO loop must ask of a model family.

One subclass per family. The loop only ever talks to this interface, so a family-specific
detail (M-RoPE token types, tile counts, pixel masks, the cache quirk) lives in exactly one
place: its adapter.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import torch
from PIL import Image

from vlm_grpo.adapters.batch import PromptBatch

Conversation = list[dict[str, Any]]
MODULE_GROUPS = ("vision", "projector", "language", "head")
# The module layout of the LLaVA-style classes (InternVL's and LLaVA's alike).
LLAVA_STYLE_GROUPS = {
    "vision": (r"model\.vision_tower\.",),
    "projector": (r"model\.multi_modal_projector\.",),
    "language": (r"model\.language_model\.",),
    "head": (r"lm_head\.",),
}


class ImageTokenMismatch(ValueError):
    """A prompt's image placeholder tokens do not match the image features the model will produce."""


class VLMAdapter(ABC):
    family: ClassVar[str]  # the name used in `--model family:PATH` and `tiny:family`
    model_types: ClassVar[tuple[str, ...]]  # config.model_type values this adapter serves
    model_class: ClassVar[type]  # transformers class used by `load`
    # group -> regexes over parameter names (re.match). Freeze policies, per-module learning
    # rates and LoRA targets all derive from this one declaration.
    module_patterns: ClassVar[dict[str, tuple[str, ...]]]
    # name -> builder(seed) of a real-size, random-weight model for GPU benchmarks
    presets: ClassVar[dict[str, Callable[..., "VLMAdapter"]]] = {}

    def __init__(self, model: torch.nn.Module, processor: Any, source: str = "", cache_policy: str = "auto"):
        self.model = model
        self.processor = processor
        self.source = source
        self.cache_policy = cache_policy
        self._use_cache: bool | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    @abstractmethod
    def tiny(cls, seed: int = 0) -> "VLMAdapter":
        """The family's real classes with random weights and a locally built tokenizer."""

    @classmethod
    def preset(cls, name: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> "VLMAdapter":
        if name not in cls.presets:
            raise ValueError(f"unknown {cls.family} preset {name!r}; known: {sorted(cls.presets)}")
        return cls.presets[name](seed=seed, dtype=dtype)

    @classmethod
    def load(
        cls,
        path: str,
        *,
        dtype: torch.dtype | str = "auto",
        device: str | None = None,
        attn_implementation: str | None = None,
        load_in_4bit: bool = False,
        trust_remote_code: bool = False,
        cache_policy: str = "auto",
    ) -> "VLMAdapter":
        """A checkpoint from a local directory or a hub id."""
        from transformers import AutoProcessor

        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if load_in_4bit:
            kwargs["quantization_config"] = _four_bit_config()
            kwargs["device_map"] = device or "auto"
        elif device:
            kwargs["device_map"] = device
        model = cls.model_class.from_pretrained(path, **kwargs)
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        _left_pad(processor)
        return cls(model.eval(), processor, source=str(path), cache_policy=cache_policy)

    def save(self, out_dir: str | Path) -> None:
        self.model.save_pretrained(out_dir)
        self.processor.save_pretrained(out_dir)

    # ---------------------------------------------------------------- tokens
    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def image_token_id(self) -> int:
        """The placeholder id that image features replace in the embedding sequence."""
        return self.model.config.image_token_id

    def suppressed_token_ids(self) -> list[int]:
        """Ids the policy must never emit: a generated placeholder breaks the training forward."""
        return sorted({self.image_token_id, *self._extra_suppressed_ids()})

    def _extra_suppressed_ids(self) -> list[int]:
        return []

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id

    # ---------------------------------------------------------------- encoding
    def encode_prompts(self, conversations: Sequence[Conversation], images: Sequence[Sequence[Image.Image]]) -> PromptBatch:
        """Chat messages + each sample's images -> one left-padded PromptBatch, checked for alignment."""
        if len(conversations) != len(images):
            raise ValueError(f"{len(conversations)} conversations but {len(images)} image lists")
        texts = [
            self.processor.apply_chat_template(list(conv), add_generation_prompt=True, tokenize=False)
            for conv in conversations
        ]
        images = [[prepare_image(img, i) for img in sample] for i, sample in enumerate(images)]
        features = self._run_processor(texts, images)
        batch = self._to_batch(features, images)
        self.check_alignment(batch)
        return batch

    def _run_processor(self, texts: list[str], images: list[list[Image.Image]]):
        flat = [img for sample in images for img in sample]
        return self.processor(text=texts, images=flat or None, padding=True, return_tensors="pt")

    @abstractmethod
    def _to_batch(self, features: Any, images: list[list[Image.Image]]) -> PromptBatch:
        """Processor output -> PromptBatch with mm_rows and image_spans filled in."""

    def _batch(
        self,
        features: Any,
        images: list[list[Image.Image]],
        mm: dict[str, torch.Tensor],
        mm_rows: dict[str, list[int]],
        token_keys: tuple[str, ...] = (),
    ) -> PromptBatch:
        """The PromptBatch a `_to_batch` ends with: the family's `mm` tensors plus the token side."""
        input_ids = features["input_ids"]
        return PromptBatch(
            input_ids=input_ids,
            attention_mask=features["attention_mask"],
            mm=mm,
            mm_rows=mm_rows,
            image_spans=self.image_token_spans(input_ids, [len(s) for s in images]),
            token_keys=token_keys,
        )

    @abstractmethod
    def feature_counts(self, batch: PromptBatch) -> list[int]:
        """Number of image features the vision side will produce for each sample."""

    def check_alignment(self, batch: PromptBatch) -> None:
        tokens = (batch.input_ids == self.image_token_id).sum(dim=1).tolist()
        for i, (n_tok, n_feat) in enumerate(zip(tokens, self.feature_counts(batch))):
            if n_tok != n_feat:
                raise ImageTokenMismatch(
                    f"sample {i}: the prompt holds {n_tok} image tokens but its images give {n_feat} "
                    f"image features ({self.family}); was the prompt tokenized with another processor, "
                    "or did a completion contain an image placeholder?"
                )

    def image_token_spans(self, input_ids: torch.Tensor, images_per_sample: list[int]) -> list[list[tuple[int, int]]]:
        """Runs of image tokens, merged per image by the family's own layout (default: one run per image)."""
        spans = []
        for row, n_images in zip(input_ids.tolist(), images_per_sample):
            runs = _runs(row, self.image_token_id)
            spans.append(self._group_runs(runs, n_images))
        return spans

    def _group_runs(self, runs: list[tuple[int, int]], n_images: int) -> list[tuple[int, int]]:
        return runs

    # ---------------------------------------------------------------- forward
    def model_inputs(self, batch: PromptBatch) -> dict[str, torch.Tensor]:
        """Model kwargs for a prompt batch; the one place a family can adjust them (generate and forward)."""
        return batch.model_inputs()

    def completion_inputs(
        self, batch: PromptBatch, completion_ids: torch.Tensor, completion_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Model kwargs for one teacher-forced forward over prompt + completion."""
        inputs = self.model_inputs(batch)
        inputs["input_ids"] = torch.cat([batch.input_ids, completion_ids], dim=1)
        inputs["attention_mask"] = torch.cat([batch.attention_mask, completion_mask.to(batch.attention_mask.dtype)], dim=1)
        for key in batch.token_keys:
            t = batch.mm[key]
            pad = torch.zeros(t.shape[0], completion_ids.shape[1], dtype=t.dtype, device=t.device)
            inputs[key] = torch.cat([t, pad], dim=1)
        return inputs

    def generate(
        self,
        batch: PromptBatch,
        *,
        max_new_tokens: int,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        use_cache: bool | None = None,
        output_logits: bool = False,
        min_new_tokens: int = 0,
        eos_token_id: list[int] | None = None,
    ):
        """Completions for `batch` with the adapter's suppressed ids and cache policy."""
        use_cache = self.uses_cache() if use_cache is None else use_cache
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            do_sample=do_sample,
            use_cache=use_cache,
            suppress_tokens=self.suppressed_token_ids(),
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_ids if eos_token_id is None else eos_token_id,
            return_dict_in_generate=True,
            output_logits=output_logits,
        )
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.model.generate(**self.model_inputs(batch), **kwargs)
        return out

    def uses_cache(self) -> bool:
        if self._use_cache is None:
            from vlm_grpo.compat.cache_policy import resolve_use_cache

            self._use_cache = resolve_use_cache(self, self.cache_policy)
        return self._use_cache

    # ---------------------------------------------------------------- parameters
    def module_group_of(self, name: str) -> str:
        name = strip_wrapper_prefix(name)  # a LoRA-wrapped model's names map to the same groups
        hits = [g for g, pats in self.module_patterns.items() if any(re.match(p, name) for p in pats)]
        if len(hits) != 1:
            raise ValueError(f"parameter {name!r} matches module groups {hits} of {self.family}; expected exactly one")
        return hits[0]

    def module_groups(self) -> dict[str, list[str]]:
        """group -> parameter names; every parameter belongs to exactly one group."""
        groups: dict[str, list[str]] = {g: [] for g in MODULE_GROUPS}
        for name, _ in self.model.named_parameters():
            groups[self.module_group_of(name)].append(name)
        return groups

    # ---------------------------------------------------------------- attention-map layout
    def image_token_positions(
        self, batch: PromptBatch, sample: int, image: int, image_size: tuple[int, int] | None = None
    ) -> list["ImageCell"]:
        """Where each image token of one image looks: one ImageCell per placeholder token, in prompt order.

        The rectangle is in normalized coordinates of the original image (0..1, y down). Tokens of a
        global tile or thumbnail cover the whole image, so cells may overlap. `image_size` is the original
        (height, width); families whose layout depends on it (InternVL's tiling) require it.
        """
        raise NotImplementedError(f"{self.family}: no image token layout declared")

    def image_token_indices(self, batch: PromptBatch, sample: int, image: int) -> list[int]:
        """Positions in `batch.input_ids[sample]` of the image's placeholder tokens (delimiters skipped)."""
        start, end = batch.image_spans[sample][image]
        ids = batch.input_ids[sample, start:end].tolist()
        return [start + k for k, tok in enumerate(ids) if tok == self.image_token_id]


class ImageCell(NamedTuple):
    """One image token and the rectangle of the image it encodes (normalized coordinates, y down)."""

    token_index: int  # position in the prompt's input_ids
    y0: float
    x0: float
    y1: float
    x1: float


def grid_cells(token_indices: Sequence[int], rows: int, cols: int, box=(0.0, 0.0, 1.0, 1.0)) -> list[ImageCell]:
    """`rows` x `cols` tokens laid out row-major over `box` = (y0, x0, y1, x1)."""
    if len(token_indices) != rows * cols:
        raise ValueError(f"{len(token_indices)} image tokens do not fill a {rows}x{cols} grid")
    y0, x0, y1, x1 = box
    h, w = (y1 - y0) / rows, (x1 - x0) / cols
    return [
        ImageCell(tok, y0 + (k // cols) * h, x0 + (k % cols) * w, y0 + (k // cols + 1) * h, x0 + (k % cols + 1) * w)
        for k, tok in enumerate(token_indices)
    ]


PEFT_PREFIX = "base_model.model."


def strip_wrapper_prefix(name: str) -> str:
    """A parameter/module name as the unwrapped model spells it (peft prefixes "base_model.model.")."""
    return name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name


def prepare_image(img: Image.Image, sample: int) -> Image.Image:
    """8-bit RGB, fully decoded, size-capped; a bad image names its sample."""
    from vlm_grpo.images import BadImage, prepare

    try:
        return prepare(img)
    except BadImage as err:
        raise ValueError(f"sample {sample}: field 'images': the image {err}") from None


def _runs(row: list[int], token_id: int) -> list[tuple[int, int]]:
    runs, start = [], None
    for pos, tok in enumerate(row + [None]):
        if tok == token_id and start is None:
            start = pos
        elif tok != token_id and start is not None:
            runs.append((start, pos))
            start = None
    return runs


def _left_pad(processor: Any) -> None:
    # Generation appends on the right; left padding keeps every prompt's last token adjacent.
    processor.tokenizer.padding_side = "left"


def _four_bit_config():
    if not torch.cuda.is_available():
        raise RuntimeError("4-bit loading (QLoRA) needs a CUDA GPU and bitsandbytes; none is available here")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
