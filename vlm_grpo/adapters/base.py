"""The adapter contract: everything the GRPO loop asks of a model family.

A family is one subclass in `adapters/families/`. It MUST declare the class attributes and implement the abstract
methods of the first two sections. Everything after them is provided, and the hooks of the last section have defaults
that a family overrides only where its model differs (M-RoPE positions, extra token-shaped inputs, extra feature
layers, delimiter tokens; cross-attention: image_routes.py). The loop talks only to this interface and its mixins.

Visual items: a prompt's image and video parts take the sample's images and videos (vlm_grpo.videos.Video) in order.
A family whose model reads video sets `takes_video` and accepts `videos=` in `_run_processor` and `_to_batch`; with
video tensors and a token of their own it names them (`video_keys`, `video_encoder_keys`, `video_token_id`) and counts
their features (`video_feature_counts`, `video_units`, `video_unit_cells`). Other families refuse a video, named.
A text-only family (`reads_images` False) has no vision groups and no placeholder: it refuses an image, named.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Sequence

import torch
from PIL import Image

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.batch import ImageSources, ImageTokenMismatch, PromptBatch, combine_rows, visual_parts
from vlm_grpo.adapters.features import ImageFeatures
from vlm_grpo.adapters.image_layout import ImageCell, LayoutFacts, token_runs
from vlm_grpo.adapters.image_routes import ImageRoutes, TextRowsNotSupported
from vlm_grpo.adapters.module_groups import ModuleLayout, group_parameters
from vlm_grpo.adapters.quirks import CacheQuirk
from vlm_grpo.adapters.video_hooks import VideoHooks
from vlm_grpo.images import prepare_sample_image
from vlm_grpo.videos import Video, prepare_sample_video

Conversation = list[dict[str, Any]]
__all__ = ["Conversation", "ImageTokenMismatch", "TextRowsNotSupported", "VLMAdapter", "VideoNotSupported"]


class VideoNotSupported(ValueError):
    """A video for a family whose model cannot take one."""


class VLMAdapter(VideoHooks, ImageRoutes, ABC):
    # ================================================================ MUST declare
    family: ClassVar[str]  # the name used in `--model family:PATH` and `tiny:family`
    model_types: ClassVar[tuple[str, ...]]  # config.model_type values this adapter serves
    model_class: ClassVar[type]  # transformers class used by `load`
    module_layout: ClassVar[ModuleLayout]  # the module groups: freezing, learning rates, LoRA targets
    tiny_architecture: ClassVar[Architecture]  # the tiny twin's sizes
    presets: ClassVar[dict[str, Architecture]] = {}  # name -> a real-size (or benchmark) architecture
    reads_images: ClassVar[bool] = True  # False: a text-only model (no vision groups, no placeholder token)
    # the families table's words where `model_types` is empty or `model_class` is a base class
    model_types_note: ClassVar[str] = ""
    model_class_note: ClassVar[str] = ""

    @classmethod
    def serves_model_type(cls, model_type: str, auto_classes=()) -> bool:  # beyond `model_types`, by a rule
        return False

    # ================================================================ MUST implement
    @classmethod
    @abstractmethod
    def build(cls, arch: Architecture, seed: int = 0, dtype: torch.dtype = torch.float32) -> "VLMAdapter":
        """The family's real model and processor classes at `arch`'s sizes, random weights drawn from `seed`,
        with a locally built tokenizer carrying the family's special tokens and chat template."""

    @abstractmethod
    def _to_batch(self, features: Any, images: list[list[Image.Image]]) -> PromptBatch:
        """Processor output -> PromptBatch with `mm`/`mm_rows` filled in (usually ends with `self._batch`)."""

    @abstractmethod
    def feature_counts(self, batch: PromptBatch) -> list[int]:
        """Image features the vision side will produce per sample, from the image tensors (never the tokens)."""

    @abstractmethod
    def image_token_positions(
        self, batch: PromptBatch, sample: int, image: int, image_size: tuple[int, int] | None = None
    ) -> list[ImageCell]:
        """One ImageCell per placeholder token of one image, in prompt order: the rectangle of the original image
        (normalized, y down) it encodes. `image_size` is the original (height, width) where the layout depends on it."""

    @abstractmethod
    def layout_facts(self, batch: PromptBatch, sample: int, image: int) -> LayoutFacts:
        """Tiles and per-tile token grid of one encoded image, read off the processor tensors and the config."""

    # ================================================================ provided: construction
    def __init__(self, model: torch.nn.Module, processor: Any, source: str = "", use_cache: bool | None = None):
        self.model = model
        self.processor = processor
        self.source = source
        # Whether generation may use the KV cache; the loader decides it from the cache policy and the probe
        # (vlm_grpo.loader). Undecided (None) generates as transformers does by default, with the cache.
        self.use_cache = use_cache

    @classmethod
    def tiny(cls, seed: int = 0) -> "VLMAdapter":
        return cls.build(cls.tiny_architecture, seed=seed, dtype=torch.float32)

    @classmethod
    def preset(cls, name: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> "VLMAdapter":
        if name not in cls.presets:
            raise ValueError(f"unknown {cls.family} preset {name!r}; known: {sorted(cls.presets)}")
        adapter = cls.build(cls.presets[name], seed=seed, dtype=dtype)
        adapter.source = f"preset:{name}"
        return adapter

    @classmethod
    def load(cls, path: str, *, dtype: torch.dtype | str = "auto", device_map: str | None = None,
             attn_implementation: str | None = None, load_in_4bit: bool = False, trust_remote_code: bool = False,
             allow_pickle_weights: bool = False) -> "VLMAdapter":
        """A checkpoint from a local directory or a hub id. Safe by default: no code shipped with it runs, and only
        safetensors weights load (unpickling .bin files can run code) unless `allow_pickle_weights`."""
        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if not allow_pickle_weights:
            kwargs["use_safetensors"] = True
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if load_in_4bit:
            from vlm_grpo.adapters.quantization import four_bit_loading

            kwargs.update(four_bit_loading(device_map))
        elif device_map:
            kwargs["device_map"] = device_map
        model = cls.checkpoint_class().from_pretrained(path, **kwargs)
        if load_in_4bit:
            from vlm_grpo.adapters.quantization import keep_differentiable_layout

            keep_differentiable_layout(model)
        return cls(model.eval(), cls.load_processor(path, trust_remote_code), source=str(path))

    @classmethod
    def checkpoint_class(cls) -> type:
        """The class whose from_pretrained reads a checkpoint of this family (default: model_class)."""
        return cls.model_class

    @classmethod
    def load_processor(cls, path: str, trust_remote_code: bool = False):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        processor.tokenizer.padding_side = "left"  # generation appends on the right: keep prompts adjacent to it
        return processor

    def save(self, out_dir: str | Path) -> None:
        self.model.save_pretrained(out_dir)
        self.processor.save_pretrained(out_dir)

    # ================================================================ provided: tokens
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

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id

    # ================================================================ provided: encoding
    def encode_prompts(self, conversations: Sequence[Conversation], images: Sequence[Sequence[Image.Image]],
                       videos: Sequence[Sequence[Video | list[Image.Image]]] | None = None,
                       tools: Sequence[list | None] | None = None) -> PromptBatch:
        """Chat messages + each sample's images (and videos: a Video or a list of frames each) -> one left-padded
        PromptBatch, checked for alignment. Image and video parts of the messages take them in order.
        `tools`: per sample, the tools (functions or JSON schemas) its chat template describes to the model."""
        videos = [[] for _ in conversations] if videos is None else videos
        if not len(conversations) == len(images) == len(videos):
            raise ValueError(f"{len(conversations)} conversations but {len(images)} image and {len(videos)} video lists")
        kinds = [visual_parts(conv) for conv in conversations]
        for i, (parts, sample_images, sample_videos) in enumerate(zip(kinds, images, videos)):
            if parts.count("image") != len(sample_images):
                raise ImageTokenMismatch(f"sample {i}: the prompt has {parts.count('image')} image parts but "
                                         f"{len(sample_images)} images")
            if parts.count("video") != len(sample_videos):
                raise ImageTokenMismatch(f"sample {i}: the prompt has {parts.count('video')} video parts but "
                                         f"{len(sample_videos)} videos")
            if sample_videos and not self.takes_video:
                raise VideoNotSupported(f"sample {i}: {self.family} cannot take video (its model reads images only); "
                                        "use a family that reads video (vlm-grpo families)")
        self.check_text_rows(images)
        texts = [self.render_prompt(list(conv), **getattr(self, "chat_template_kwargs", {}), **({"tools": list(t)} if t else {}))
                 for conv, t in zip(conversations, tools or [None] * len(conversations))]
        images = [[prepare_sample_image(img, i) for img in sample] for i, sample in enumerate(images)]
        if not any(videos):  # the image-only path every family has
            batch = self._to_batch(self._run_processor(texts, images), images)
        else:
            videos = [[prepare_sample_video(v, i) for v in sample] for i, sample in enumerate(videos)]
            batch = self._to_batch(self._run_processor(texts, images, videos=videos), images, videos=videos)
            batch.image_spans, batch.video_spans = self._visual_spans(batch, kinds, videos)
        self.check_alignment(batch)
        return batch

    def render_prompt(self, messages: Conversation, **options: Any) -> str:  # up to the assistant's answer
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **options)

    def encode_turns(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]]) -> PromptBatch:
        """Text continuing conversations (a tool turn, up to the next assistant header) with its images, one sample
        each: encoded like prompts without the tokenizer's special tokens, left-padded, checked for alignment."""
        images = [[prepare_sample_image(img, i) for img in sample] for i, sample in enumerate(images)]
        batch = self._to_batch(self._run_processor(list(texts), images, add_special_tokens=False), images)
        self.check_alignment(batch)
        return batch

    def _batch(self, features: Any, images: list[list[Image.Image]], mm: dict[str, torch.Tensor],
               mm_rows: dict[str, list[int]], token_keys: tuple[str, ...] = (), videos: list[list[Video]] | None = None
               ) -> PromptBatch:
        """The PromptBatch a `_to_batch` ends with: the family's `mm` tensors plus the token side. With videos the
        spans are left to `encode_prompts`, which knows the order of image and video parts."""
        input_ids = features["input_ids"]
        return PromptBatch(
            input_ids=input_ids,
            attention_mask=features["attention_mask"],
            mm=mm,
            mm_rows=mm_rows,
            image_spans=[] if videos and any(videos) else self.image_token_spans(input_ids, [len(s) for s in images]),
            token_keys=token_keys,
        )

    def check_alignment(self, batch: PromptBatch) -> None:
        tokens = (batch.input_ids == self.image_token_id).sum(dim=1).tolist()
        for i, (n_tok, n_feat) in enumerate(zip(tokens, self.feature_counts(batch))):
            if n_tok != n_feat:
                raise ImageTokenMismatch(
                    f"sample {i}: the prompt holds {n_tok} image tokens but its images give {n_feat} "
                    f"image features ({self.family}); was the prompt tokenized with another processor, "
                    "or did a completion contain an image placeholder?"
                )
        if self.video_token_id == self.image_token_id:  # frames are images: counted above
            return
        tokens = (batch.input_ids == self.video_token_id).sum(dim=1).tolist()
        for i, (n_tok, n_feat) in enumerate(zip(tokens, self.video_feature_counts(batch))):
            if n_tok != n_feat:
                raise ImageTokenMismatch(f"sample {i}: the prompt holds {n_tok} video tokens but its videos give "
                                         f"{n_feat} video features ({self.family})")

    def image_token_spans(self, input_ids: torch.Tensor, images_per_sample: list[int]) -> list[list[tuple[int, int]]]:
        """Runs of image tokens, merged per image by the family's own layout (default: one run per image)."""
        return [self._group_runs(token_runs(row, self.image_token_id), n)
                for row, n in zip(input_ids.tolist(), images_per_sample)]

    def image_token_indices(self, batch: PromptBatch, sample: int, image: int) -> list[int]:
        """Positions in `batch.input_ids[sample]` of the image's placeholder tokens (delimiters skipped)."""
        start, end = batch.image_spans[sample][image]
        ids = batch.input_ids[sample, start:end].tolist()
        return [start + k for k, tok in enumerate(ids) if tok == self.image_token_id]

    # ================================================================ provided: forward and generation
    def model_inputs(self, batch: PromptBatch) -> dict[str, torch.Tensor]:
        """Model kwargs for a prompt batch; the one place a family can adjust them (generate and forward)."""
        return batch.model_inputs()

    def completion_inputs(self, batch: PromptBatch, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          completion_types: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model kwargs for one teacher-forced forward over prompt + completion. `completion_types`: token-shaped
        values over the completion ([N, T] per key) where it shows images (tool turns); otherwise text (0)."""
        inputs = self.model_inputs(batch)
        inputs["input_ids"] = torch.cat([batch.input_ids, completion_ids], dim=1)
        inputs["attention_mask"] = torch.cat([batch.attention_mask, completion_mask.to(batch.attention_mask.dtype)], dim=1)
        types = completion_types or {}
        for key in dict.fromkeys([*batch.token_keys, *types]):
            prompt = batch.mm[key] if key in batch.mm else batch.input_ids.new_zeros(batch.input_ids.shape)
            tail = types[key].to(prompt) if key in types else self.completion_tail(key, prompt, completion_ids.shape[1])
            inputs[key] = torch.cat([prompt, tail], dim=1)
        return inputs

    def generate(self, batch: PromptBatch, **settings: Any):
        """Completions for `batch` with the suppressed ids and the cache decision (settings: `generation_kwargs`)."""
        with torch.no_grad():
            return self.model.generate(**self.model_inputs(batch), **self.generation_kwargs(**settings))

    def generation_kwargs(self, *, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
                          top_p: float = 1.0, top_k: int = 0, use_cache: bool | None = None, output_logits: bool = False,
                          min_new_tokens: int = 0, eos_token_id: list[int] | None = None,
                          sampler: str = "inverse_cdf") -> dict[str, Any]:
        """`generate()` settings of every generation path: suppression, EOS, sampling, and the cache decision
        unless `use_cache` forces one. `sampler` (with do_sample): "inverse_cdf" draws from generate()'s distribution
        with one uniform per row (adapters/sampler.py); "multinomial" is generate()'s own draw."""
        from vlm_grpo.adapters.sampler import inverse_cdf_generation, sampler_draws  # transformers: only to generate
        eos = self.eos_token_ids if eos_token_id is None else eos_token_id
        if do_sample and sampler_draws(sampler, output_logits):
            greedy = self.generation_kwargs(max_new_tokens=max_new_tokens, use_cache=use_cache, eos_token_id=eos)
            return inverse_cdf_generation(greedy, self.model.generation_config, self.suppressed_token_ids(), eos,
                                          min_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            # 0 as None: with any min_new_tokens, generate() masks EOS below a min_length (the prompt's, for 0), a
            # vocabulary-wide mask built at every step that never masks anything
            min_new_tokens=min_new_tokens or None,
            do_sample=do_sample,
            use_cache=(self.use_cache is not False) if use_cache is None else use_cache,
            suppress_tokens=self.suppressed_token_ids(),
            pad_token_id=self.pad_token_id,
            eos_token_id=eos,
            return_dict_in_generate=True,
            output_logits=output_logits,
        )
        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        kwargs.update(sampling if do_sample else dict.fromkeys(sampling))
        return kwargs

    # ================================================================ provided: parameters
    def module_group_of(self, name: str) -> str:
        return self.module_layout.group_of(name, self.family)

    def module_groups(self) -> dict[str, list[str]]:
        """group -> parameter names; every parameter belongs to exactly one group."""
        return group_parameters(self.module_layout, self.model, self.family)

    def training_group_of(self, name: str) -> str:
        """A parameter's sub-group where it has one (`experts`), else its module group: what freezing and
        per-group learning rates go by."""
        return self.module_layout.training_group_of(name, self.family)

    def router_aux_loss_coef(self, override: float | None = None) -> float:
        """Weight of the mixture-of-experts routers' load-balancing loss in the training loss, by TRL's rule: a
        model whose text config declares `output_router_logits` has routers; `override` (a run setting) or else
        the config's `router_aux_loss_coef` weighs their loss. 0.0: none to add."""
        text = self.model.config.get_text_config()
        if not hasattr(text, "output_router_logits"):
            if override:
                raise ValueError(f"router_aux_loss_coef={override}, but {self.family} is not a mixture-of-experts "
                                 "model that returns router logits: there is no auxiliary loss to weigh")
            return 0.0
        return float(getattr(text, "router_aux_loss_coef", 0.0) if override is None else override)

    def check_module_groups(self) -> None:
        """Raise (one line naming the parameters) unless every parameter is in exactly one group."""
        self.module_groups()

    # ================================================================ optional hooks (defaults)
    # tensors read only by the vision encoder: dropped once features are computed (sharing.text_side)
    pixel_keys: ClassVar[tuple[str, ...]] = ("pixel_values", "pixel_attention_mask")
    # token-shaped inputs the forward still needs beside `inputs_embeds` (e.g. token types behind the mask)
    embedding_forward_keys: ClassVar[tuple[str, ...]] = ()
    # the faster paths of sharing.py hold for this model: image features encoded once and placed at the image
    # tokens (`shares_features`); a prompt prefilled once, its KV cache expanded G times (`shares_prefix`).
    # Family files prove them in the contract suite; the generic adapter measures them per model (calibrate.py).
    shares_features: ClassVar[bool] = True
    shares_prefix: ClassVar[bool] = True
    # known generation-cache quirks by transformers version: `auto` skips the KV cache where one applies (compat/)
    cache_quirks: ClassVar[tuple[CacheQuirk, ...]] = ()

    def _extra_suppressed_ids(self) -> list[int]:
        """Delimiter and layout tokens beside the image placeholder that the policy must not emit."""
        return []

    def _run_processor(self, texts: list[str], images: list[list[Image.Image]], videos: list[list[Video]] | None = None,
                       **text_options):
        flat = [img for sample in images for img in sample]
        clips = [v for sample in videos or [] for v in sample]
        video_args = {"videos": [v.frames for v in clips], "video_metadata": [v.metadata() for v in clips],
                      "do_sample_frames": False} if clips else {}  # frames were sampled when the data was read
        return self.processor(text=texts, images=flat or None, padding=True, return_tensors="pt", **video_args,
                              **text_options)

    def combine_images(self, sources: ImageSources, keys: Sequence[str]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
        """(mm, mm_rows) of new samples for `keys`: sample k shows the images of samples `sources[k]` ((batch,
        index) pairs: a row's prompt, then its tool turns) in order. Default: leading rows per sample (flat
        layouts); a family whose tensors pad per sample overrides it."""
        return combine_rows(sources, keys)

    def _group_runs(self, runs: list[tuple[int, int]], n_images: int) -> list[tuple[int, int]]:
        """Runs of placeholder tokens -> one [start, end) per image (default: a run is an image)."""
        return runs

    def extra_image_features(self, encoder_output: Any) -> tuple[torch.Tensor, ...]:
        """Per-token features beyond `pooler_output` that the model feeds into later layers (default: none)."""
        return ()

    def inputs_with_features(self, full_inputs: dict[str, torch.Tensor], features: ImageFeatures,
                             core: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Model kwargs that carry precomputed image features instead of pixels (default: token embeddings with
        the features placed at the image tokens, as the models' own forwards do)."""
        ids = full_inputs["input_ids"]
        embeds = core.get_input_embeddings()(ids)
        placed = [(self.image_token_id, features)]
        if features.videos is not None and self.video_token_id != self.image_token_id:
            placed.append((self.video_token_id, features.videos))
        for token_id, feats in placed:
            if feats.flat.shape[0]:
                mask = (ids == token_id).unsqueeze(-1)
                embeds = embeds.masked_scatter(mask, feats.flat.to(embeds.device, embeds.dtype))
        kept = {k: full_inputs[k] for k in self.embedding_forward_keys if k in full_inputs}
        return {"inputs_embeds": embeds, "attention_mask": full_inputs["attention_mask"], **kept}

    def shared_position_ids(self, full_inputs: dict[str, torch.Tensor], core: torch.nn.Module) -> torch.Tensor | None:
        """Position ids for a features forward, given the kwargs the plain forward would get (default: whatever
        `completion_inputs` set; None lets the model count positions itself)."""
        return full_inputs.get("position_ids")

    def expand_generation_state(self, prefix: PromptBatch, repeats: int, core: torch.nn.Module) -> None:
        """After prefilling `prefix` and expanding its KV cache `repeats` times: expand any per-row state the model
        keeps outside the cache (default: none)."""

    def vision_call_images(self, args: tuple, kwargs: dict) -> int:
        """Images (tiles, for tiled families) one call of the vision tower encodes."""
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        return int(pixels.shape[0]) if isinstance(pixels, torch.Tensor) else 0
