"""Sharing work across a GRPO group: one prompt, G completions.

Each prompt's images and videos are encoded once (`image_features`) and placed into every sequence that shows them
(`embed_with_features`); each prompt is prefilled once and its KV cache expanded G times
(`generate_shared`). The engine is written once, here; a family adjusts it only through the adapter's
sharing hooks (`shared_position_ids`, `expand_generation_state`, `inputs_with_features`,
`extra_image_features`, `pixel_keys`; see contract.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.cache_names import cache_argument, returned_cache
from vlm_grpo.adapters.features import ImageFeatures, flatten_pooled, generation_positions, hf_core


class GroupGeneration(NamedTuple):
    """What `generate_shared` returns: `generate()`'s output for B*G rows and what it cost."""

    output: Any  # generate()'s output; `.sequences` are the prompt (left-padded) + completion of every row
    features: ImageFeatures | None  # the prompts' image features (detached) when they were computed here
    prefill_tokens: int  # prompt tokens the model processed (pads excluded)
    shared: bool  # whether the prompt prefix was prefilled once per prompt


def text_side(adapter, batch: PromptBatch) -> PromptBatch:
    """`batch` without the pixel tensors (kept: grids and token types, which positions need)."""
    keep = [k for k in batch.mm if k not in adapter.pixel_keys]
    return replace(batch, mm={k: batch.mm[k] for k in keep}, mm_rows={k: batch.mm_rows[k] for k in keep})


def vision_inputs(adapter, batch: PromptBatch) -> dict[str, torch.Tensor]:
    """The tensors `get_image_features` takes for `batch` (none when no sample has an image)."""
    inputs = adapter.model_inputs(batch)
    return {k: v for k, v in inputs.items()
            if k in batch.mm and k not in batch.token_keys and k not in adapter.video_keys}


def image_features(adapter, batch: PromptBatch, model: torch.nn.Module | None = None) -> ImageFeatures:
    """Every image token's feature for `batch`, from the model's own `get_image_features` (one encoder call), and
    every video token's from `get_video_features` (one more) where videos have a token of their own."""
    core = hf_core(adapter.model if model is None else model)
    counts = adapter.feature_counts(batch)
    vision = vision_inputs(adapter, batch)
    encoder = core.model if hasattr(getattr(core, "model", None), "get_image_features") else core
    video_counts = adapter.video_feature_counts(batch)
    videos = _video_features(adapter, batch, encoder, video_counts) if sum(video_counts) else None
    if not vision or not sum(counts):
        emb = core.get_input_embeddings()
        return ImageFeatures(emb.weight.new_zeros(0, emb.embedding_dim), counts, videos=videos)
    out = encoder.get_image_features(**vision, return_dict=True)
    return ImageFeatures(flatten_pooled(out.pooler_output), counts, adapter.extra_image_features(out), videos)


def _video_features(adapter, batch: PromptBatch, encoder, counts: list[int]) -> ImageFeatures:
    inputs = adapter.model_inputs(batch)
    out = encoder.get_video_features(**{k: inputs[k] for k in adapter.video_encoder_keys}, return_dict=True)
    return ImageFeatures(flatten_pooled(out.pooler_output), counts, adapter.extra_image_features(out))


def embed_with_features(
    adapter,
    batch: PromptBatch,
    features: ImageFeatures,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    model: torch.nn.Module | None = None,
    completion_types: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Model kwargs for prompt + completion with `features` in place of the pixels.

    `features` holds the image features of `batch`'s rows in order (e.g. `ImageFeatures.select` of each row's
    prompt, then the images its tool turns showed); they go to the image-token positions, as the model's own
    forward puts them. `batch` may lack the pixel tensors (`text_side`). `completion_types`: token-shaped values
    over completions that show images (see `VLMAdapter.completion_inputs`).
    """
    core = hf_core(adapter.model if model is None else model)
    full = adapter.completion_inputs(batch, completion_ids, completion_mask, completion_types)
    n_tokens = int((full["input_ids"] == adapter.image_token_id).sum())
    if n_tokens != features.flat.shape[0]:
        raise ImageTokenMismatch(f"{adapter.family}: {n_tokens} image tokens but {features.flat.shape[0]} image features to place")
    if adapter.video_token_id != adapter.image_token_id:
        n_video = int((full["input_ids"] == adapter.video_token_id).sum())
        placed = 0 if features.videos is None else features.videos.flat.shape[0]
        if n_video != placed:
            raise ImageTokenMismatch(f"{adapter.family}: {n_video} video tokens but {placed} video features to place")
    inputs = adapter.inputs_with_features(full, features, core)
    positions = adapter.shared_position_ids(full, core)
    if positions is not None:
        inputs["position_ids"] = positions
    return inputs


def generate_shared(
    adapter, batch: PromptBatch, num_generations: int, *, features: ImageFeatures | None = None, **settings: Any
) -> GroupGeneration:
    """`num_generations` completions of each prompt of `batch`, rows grouped like `batch.repeat(G)`.

    Each prompt's images are encoded once and its prompt (all but the last token) prefilled once; the KV
    cache is expanded G times and `generate()` continues from it with the same suppression, EOS and
    sampling settings as `adapter.generate`. Where the cache policy forbids the KV cache, the adapter does not share
    prefixes (`shares_prefix`), or the prompt cannot be split before its last token, this is exactly
    `adapter.generate(batch.repeat(G))`.
    """
    model = adapter.model
    kwargs = adapter.generation_kwargs(**settings)
    length = batch.input_ids.shape[1]
    core = hf_core(model)
    # a static cache the prefix can be copied into (None: not asked for, or sliding / recurrent layers, which
    # generate() fills itself on the plain path)
    wants_static = wants_static_cache(model)
    static = empty_static_cache(core, length + kwargs["max_new_tokens"]) if wants_static else None
    if not kwargs["use_cache"] or not adapter.shares_prefix or length < 2 or (wants_static and static is None) \
            or bool((batch.input_ids[:, -1] == adapter.image_token_id).any()):
        grouped = batch.repeat(num_generations)
        with torch.no_grad():
            out = model.generate(**adapter.model_inputs(grouped), **kwargs)
        return GroupGeneration(out, None, int(grouped.attention_mask.sum()), shared=False)
    prefix = prompt_prefix(text_side(adapter, batch), length - 1)
    with torch.no_grad():
        features = image_features(adapter, batch) if features is None else features
        empty = batch.input_ids[:, :0]
        inputs = embed_with_features(adapter, prefix, features, empty, empty)
        inputs.setdefault("position_ids", generation_positions(inputs["attention_mask"]))
        cache = returned_cache(model(**inputs, use_cache=True, logits_to_keep=1))
        rows = torch.arange(len(batch), device=batch.input_ids.device).repeat_interleave(num_generations)
        if static is not None:  # the prefix goes into a static cache of every row's full length
            cache = fill_static(static, cache, rows)
            kwargs = {**kwargs, "cache_implementation": None}  # the cache is given: generate() must not build one
        else:
            select_cache_rows(cache, rows)
        adapter.expand_generation_state(prefix, num_generations, core)
        out = model.generate(
            input_ids=batch.input_ids.repeat_interleave(num_generations, dim=0),
            attention_mask=batch.attention_mask.repeat_interleave(num_generations, dim=0),
            **cache_argument(core.forward, cache),  # generate hands it on to the forward
            **kwargs,
        )
    prefill = int(prefix.attention_mask.sum()) + len(batch) * num_generations  # + each row's last prompt token
    return GroupGeneration(out, features.detach(), prefill, shared=True)


def wants_static_cache(model) -> bool:
    """Whether rollouts decode with a static KV cache (`generation.cache_implementation static`: fixed-shape tensors,
    which transformers compiles the decode step over: on a GPU by itself, on a CPU with `generation.compile_decode`)."""
    return getattr(model.generation_config, "cache_implementation", None) == "static"


def empty_static_cache(core, max_len: int):
    """An empty StaticCache of `max_len` positions for the model, if every layer is a plain full-attention one (the
    prefix copy writes whole rows); None for sliding-window or recurrent layers."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:
        static = StaticCache(config=core.config, max_cache_len=max_len)
    except (TypeError, ValueError, AttributeError):  # a config the cache class cannot read its layers from
        return None
    return static if static.layers and all(type(layer) is StaticLayer for layer in static.layers) else None


def fill_static(static, cache, rows: torch.Tensor):
    """`static` holding row `rows[k]` of `cache` (a prefilled dynamic cache) as its row k, written through the
    cache's own `update`."""
    layers = getattr(cache, "layers", None) or []
    if len(layers) != len(static.layers) or any(getattr(layer, "keys", None) is None for layer in layers):
        raise RuntimeError(f"the prefilled cache has {len(layers)} layers, the static cache {len(static.layers)} "
                           "key/value layers: they cannot be copied one to one")
    for index, layer in enumerate(layers):
        static.update(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), index)
    return static


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Make row `rows[k]` of `cache` its row k (repeats allowed), in every kind of layer: `reorder_cache` indexes the
    keys and values and also the recurrent and convolution states of linear-attention layers (Qwen3.5's Gated
    DeltaNet), which `batch_repeat_interleave` and `batch_select_indices` do not support. Differentiable."""
    cache.reorder_cache(rows)


def prompt_prefix(batch: PromptBatch, length: int) -> PromptBatch:
    """The first `length` positions of every (left-padded) prompt, token-shaped tensors included."""
    mm = {k: (v[:, :length] if k in batch.token_keys else v) for k, v in batch.mm.items()}
    return replace(batch, input_ids=batch.input_ids[:, :length], attention_mask=batch.attention_mask[:, :length], mm=mm)
