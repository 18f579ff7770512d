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
from vlm_grpo.adapters.features import ImageFeatures, flatten_pooled, generation_positions, hf_core

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
        allow_pickle_weights: bool = False,
    ) -> "VLMAdapter":
        """A checkpoint from a local directory or a hub id.

        Safe by default: no code shipped with the checkpoint runs, and only safetensors weights load
        (pickled .bin files can execute code when unpickled) unless `allow_pickle_weights`.
        """
        from transformers import AutoProcessor

        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if not allow_pickle_weights:
            kwargs["use_safetensors"] = True
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

    def generate(self, batch: PromptBatch, **settings: Any):
        """Completions for `batch` with the adapter's suppressed ids and cache policy (settings: see
        `_generation_kwargs`)."""
        kwargs = self._generation_kwargs(**settings)
        with torch.no_grad():
            out = self.model.generate(**self.model_inputs(batch), **kwargs)
        return out

    def _generation_kwargs(
        self,
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
    ) -> dict[str, Any]:
        """`generate()` settings shared by the plain and the shared-prefix paths: suppression, EOS, sampling,
        and the cache policy when `use_cache` is None."""
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            do_sample=do_sample,
            use_cache=self.uses_cache() if use_cache is None else use_cache,
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
        return kwargs

    def uses_cache(self) -> bool:
        if self._use_cache is None:
            from vlm_grpo.compat.cache_policy import resolve_use_cache

            self._use_cache = resolve_use_cache(self, self.cache_policy)
        return self._use_cache

    # ---------------------------------------------------------------- sharing work across a group
    # A GRPO group is one prompt and G completions: its images are encoded once (image_features) and
    # placed into every sequence that shows them (embed_with_features); its prompt is prefilled once and
    # the KV cache expanded G times (generate_shared). Families adjust positions and generation state
    # through the two hooks `shared_position_ids` and `expand_generation_state`.
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "pixel_attention_mask")  # read only by the encoder

    def text_side(self, batch: PromptBatch) -> PromptBatch:
        """`batch` without the pixel tensors (kept: grids and token types, which positions need)."""
        from dataclasses import replace

        keep = [k for k in batch.mm if k not in self.pixel_keys]
        return replace(batch, mm={k: batch.mm[k] for k in keep}, mm_rows={k: batch.mm_rows[k] for k in keep})

    def vision_inputs(self, batch: PromptBatch) -> dict[str, torch.Tensor]:
        """The tensors `get_image_features` takes for `batch` (none when no sample has an image)."""
        inputs = self.model_inputs(batch)
        return {k: v for k, v in inputs.items() if k in batch.mm and k not in batch.token_keys}

    def image_features(self, batch: PromptBatch, model: torch.nn.Module | None = None) -> ImageFeatures:
        """Every image token's feature for `batch`, from the model's own `get_image_features` (one encoder call)."""
        core = hf_core(self.model if model is None else model)
        counts = self.feature_counts(batch)
        vision = self.vision_inputs(batch)
        if not vision or not sum(counts):
            emb = core.get_input_embeddings()
            return ImageFeatures(emb.weight.new_zeros(0, emb.embedding_dim), counts)
        encoder = core.model if hasattr(getattr(core, "model", None), "get_image_features") else core
        out = encoder.get_image_features(**vision, return_dict=True)
        return ImageFeatures(flatten_pooled(out.pooler_output), counts)

    def embed_with_features(
        self,
        batch: PromptBatch,
        features: ImageFeatures | torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        model: torch.nn.Module | None = None,
    ) -> dict[str, torch.Tensor]:
        """Model kwargs for prompt + completion with `inputs_embeds` in place of ids and pixels.

        `features` holds the image features of `batch`'s rows in order (e.g. `ImageFeatures.for_samples`
        of each row's prompt); they are scattered at the image-token positions, as the model's own forward
        does. `batch` may lack the pixel tensors (`text_side`).
        """
        core = hf_core(self.model if model is None else model)
        full = self.completion_inputs(batch, completion_ids, completion_mask)
        ids = full["input_ids"]
        embeds = core.get_input_embeddings()(ids)
        flat = features.flat if isinstance(features, ImageFeatures) else features
        image_mask = ids == self.image_token_id
        n_tokens = int(image_mask.sum())
        if n_tokens != flat.shape[0]:
            raise ImageTokenMismatch(f"{self.family}: {n_tokens} image tokens but {flat.shape[0]} image features to place")
        if n_tokens:
            embeds = embeds.masked_scatter(image_mask.unsqueeze(-1), flat.to(embeds.device, embeds.dtype))
        inputs = {"inputs_embeds": embeds, "attention_mask": full["attention_mask"]}
        positions = self.shared_position_ids(full, core)
        if positions is not None:
            inputs["position_ids"] = positions
        return inputs

    def shared_position_ids(self, full_inputs: dict[str, torch.Tensor], core: torch.nn.Module) -> torch.Tensor | None:
        """Position ids for an `inputs_embeds` forward, given the kwargs the plain forward would get
        (default: whatever `completion_inputs` set; None lets the model count positions itself)."""
        return full_inputs.get("position_ids")

    def expand_generation_state(self, prefix: PromptBatch, repeats: int, core: torch.nn.Module) -> None:
        """After prefilling `prefix` and expanding its KV cache `repeats` times: expand any per-row state the
        model keeps outside the cache (default: none)."""

    def vision_module(self, model: torch.nn.Module | None = None) -> torch.nn.Module:
        """The vision tower: the deepest module that holds every `vision` parameter (for call counting)."""
        model = self.model if model is None else model
        names = [n.split(".")[:-1] for n, _ in model.named_parameters() if self.module_group_of(n) == "vision"]
        if not names:
            raise ValueError(f"{self.family}: no vision parameters")
        prefix = names[0]
        for parts in names[1:]:
            k = 0
            while k < min(len(prefix), len(parts)) and prefix[k] == parts[k]:
                k += 1
            prefix = prefix[:k]
        return model.get_submodule(".".join(prefix))

    def vision_call_images(self, args: tuple, kwargs: dict) -> int:
        """Images (tiles, for tiled families) one call of `vision_module` encodes."""
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        return int(pixels.shape[0]) if isinstance(pixels, torch.Tensor) else 0

    def generate_shared(
        self, batch: PromptBatch, num_generations: int, *, features: ImageFeatures | None = None, **settings: Any
    ) -> "GroupGeneration":
        """`num_generations` completions of each prompt of `batch`, rows grouped like `batch.repeat(G)`.

        Each prompt's images are encoded once and its prompt (all but the last token) prefilled once; the KV
        cache is expanded G times and `generate()` continues from it with the same suppression, EOS and
        sampling settings as `generate`. Where the cache policy forbids the KV cache, or the prompt cannot
        be split before its last token, this is exactly `generate(batch.repeat(G))`.
        """
        kwargs = self._generation_kwargs(**settings)
        length = batch.input_ids.shape[1]
        if not kwargs["use_cache"] or length < 2 or bool((batch.input_ids[:, -1] == self.image_token_id).any()):
            grouped = batch.repeat(num_generations)
            with torch.no_grad():
                out = self.model.generate(**self.model_inputs(grouped), **kwargs)
            return GroupGeneration(out, None, int(grouped.attention_mask.sum()), shared=False)
        core = hf_core(self.model)
        prefix = _prompt_prefix(self.text_side(batch), length - 1)
        with torch.no_grad():
            features = self.image_features(batch) if features is None else features
            empty = batch.input_ids[:, :0]
            inputs = self.embed_with_features(prefix, features, empty, empty)
            inputs.setdefault("position_ids", generation_positions(inputs["attention_mask"]))
            cache = self.model(**inputs, use_cache=True, logits_to_keep=1).past_key_values
            cache.batch_repeat_interleave(num_generations)
            self.expand_generation_state(prefix, num_generations, core)
            out = self.model.generate(
                input_ids=batch.input_ids.repeat_interleave(num_generations, dim=0),
                attention_mask=batch.attention_mask.repeat_interleave(num_generations, dim=0),
                past_key_values=cache,
                **kwargs,
            )
        prefill = int(prefix.attention_mask.sum()) + len(batch) * num_generations  # + each row's last prompt token
        return GroupGeneration(out, features.detach(), prefill, shared=True)

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


class GroupGeneration(NamedTuple):
    """What `VLMAdapter.generate_shared` returns: `generate()`'s output for B*G rows and what it cost."""

    output: Any  # generate()'s output; `.sequences` are the prompt (left-padded) + completion of every row
    features: ImageFeatures | None  # the prompts' image features (detached) when they were computed here
    prefill_tokens: int  # prompt tokens the model processed (pads excluded)
    shared: bool  # whether the prompt prefix was prefilled once per prompt


def _prompt_prefix(batch: PromptBatch, length: int) -> PromptBatch:
    """The first `length` positions of every (left-padded) prompt, token-shaped tensors included."""
    from dataclasses import replace

    mm = {k: (v[:, :length] if k in batch.token_keys else v) for k, v in batch.mm.items()}
    return replace(batch, input_ids=batch.input_ids[:, :length], attention_mask=batch.attention_mask[:, :length], mm=mm)


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
