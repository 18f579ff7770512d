"""A model type's default config shrunk to a tiny twin, by rules on config field names (no model type named).

Every width-like field of every sub-config becomes the same width (`WIDTH`): a field that must equal another
(a projector's input = the vision width, `out_hidden_size` = the text width, ...) then does, whatever the
defaults said. Heads, head dims, layers, experts and their per-layer lists shrink with them; rotary sections are
rescaled to the new head dim. Token ids and the vocabulary are set afterwards, from the twin's tokenizer
(`twin.py`); image sizes from the vision side's patch size (`image_side`).
"""

from __future__ import annotations

import math
import re
from typing import Any

WIDTH = 64  # every hidden width, vision and text alike
FFN = 4 * WIDTH  # every feed-forward width (4x: a pixel shuffle of ratio 1/2 feeds the hidden width x 4 into it)
MOE_FFN = 32  # an expert's feed-forward width
HEADS = 4
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
SLIDING_WINDOW = 32  # shorter than the probe prompts, so sliding layers really slide
PATCHES_PER_SIDE = 8  # the vision side's patch grid for a fixed-size image
POOLED_TOKENS = (PATCHES_PER_SIDE // 2) ** 2  # image tokens of a model that pools an image to a fixed count

WIDTH_KEYS = {
    "hidden_size", "embed_dim", "d_model", "hidden_dim", "width", "out_hidden_size", "text_hidden_size", "projection_dim",
    "vision_output_dim", "projector_input_dim", "projector_output_dim", "mm_hidden_size", "vision_hidden_size",
    "projector_hidden_size", "projection_hidden_dim", "projection_hidden_size", "word_embed_proj_dim",
    "vision_embed_dim", "text_embed_dim", "output_dim", "patch_embed_hidden_size", "vision_dim", "text_dim",
    "lm_hidden_size", "llm_hidden_size", "encoder_hidden_size", "hidden_channels", "embedding_dim", "n_embd",
    "hidden_size_per_layer_input", "adapter_in_dim", "adapter_out_dim", "mm_embed_dim", "output_proj_dims",
    "output_channels",
}
FFN_KEYS = {
    "intermediate_size", "ffn_dim", "mlp_dim", "intermediate_size_mlp", "projection_intermediate_size", "encoder_ffn_dim",
    "decoder_ffn_dim", "n_inner", "ffn_hidden_size", "mlp_hidden_size",
}
MOE_FFN_KEYS = {
    "moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts_intermediate_size",
    "shared_intermediate_size", "expert_intermediate_size", "share_expert_dim",
}
HEAD_KEYS = {
    "num_attention_heads", "num_heads", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
    "resampler_n_heads", "resampler_heads", "swa_num_attention_heads", "n_head", "attention_heads",
}
KV_HEAD_KEYS = {"num_key_value_heads", "n_kv_heads", "swa_num_key_value_heads", "num_kv_heads"}
HEAD_DIM_KEYS = {"head_dim", "resampler_head_dim", "swa_head_dim", "resampler_dim_head", "v_head_dim", "attention_head_dim"}
LAYER_KEYS = {
    "num_hidden_layers", "num_layers", "depth", "n_layers", "encoder_layers", "decoder_layers", "num_encoder_layers",
    "num_decoder_layers", "resampler_depth", "n_layer", "num_global_layers", "vision_layers",
}
EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"}
TOP_K_KEYS = {"num_experts_per_tok", "moe_topk", "moe_k", "top_k", "num_selected_experts", "experts_per_token"}
SHARED_EXPERT_KEYS = {"moe_num_shared_experts", "n_shared_experts", "num_shared_experts"}
GROUP_KEYS = {"n_group", "topk_group", "num_expert_group"}
POOLED_KEYS = {"mm_tokens_per_image", "vision_soft_tokens_per_image"}
# a learned position table's length: positions past it are clamped to its last row (Gemma 4 unified's patch
# positions), so a twin needs rows for its own patch grid only, not the default's thousands
POSITION_TABLE_KEYS = {"mm_posemb_size"}
POSITION_ROWS = 8 * PATCHES_PER_SIDE
LORA_RANK_KEYS = {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8}
# lists indexing layers (of this config, or the vision side's for feature layers)
# counts of the last layers that do something differently (Gemma 3n: layers reusing an earlier layer's KV cache)
LAYER_SUBSET_KEYS = {"num_kv_shared_layers"}
# a timm tower's size is set through its constructor's own arguments (those the architecture takes): a sixteenth of
# the channels, the layer/width/head caps above, and a pooled output grid of POOLED_TOKENS
TIMM_ARGS = {"channel_multiplier": 1 / 16, "msfa_output_resolution": PATCHES_PER_SIDE // 2, "depth": LAYERS,
             "embed_dim": WIDTH, "num_heads": HEADS}
# an int field naming one layer (MiniCPM-V 4.6's `insert_layer_id`: where the vision merger runs): mapped onto the
# new depth like the index lists (left at 6 of 2 layers, the merger never runs and images bleed into each other)
LAYER_INDEX_SUFFIXES = ("_layer_id", "_layer_idx", "_layer_index")
INDEX_LIST_KEYS = {"fullatt_block_indexes", "deepstack_visual_indexes", "vision_feature_layer", "moe_layers",
                   "spatial_target_layers", "summary_idxs", "ple_layer_ids", "global_layer_indexes", "global_attn_indexes"}
# a weight-init spread so small that random weights wash the image out (GOT-OCR2's vision config: 1e-10; the image
# then moves the logits by 1e-20 and the cache probe is blind) is raised to the common one
MIN_INIT_RANGE, INIT_RANGE = 1e-3, 0.02
BRIDGE_SUFFIXES = ("_adapter", "_projector")  # sub-configs of the vision-to-text bridge (by model_type)


def is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def sub_configs(config) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in vars(config).items() if not k.startswith("_") and is_config(v)]


def config_nodes(config) -> list:
    """`config` and its direct sub-configs."""
    return [config] + [sub for _, sub in sub_configs(config)]


def shrink_config(config) -> None:
    """Shrink `config` and its sub-configs in place."""
    merged = _merged_width_fields(config)
    _shrink_node(config)
    _shrink_timm(config)
    for _, sub in sub_configs(config):
        shrink_config(sub)
    _fix_feature_layers(config)
    for node, key, factor in merged:
        setattr(node, key, WIDTH * factor)


MERGE_KEYS = ("merge_size", "spatial_merge_size")
MERGED_INPUT_KEYS = {"out_hidden_size", "projector_input_dim", "mm_hidden_size", "vision_output_dim"}


def _merged_width_fields(config) -> list[tuple[Any, str, int]]:
    """Width fields outside the vision config that hold the vision width times its merge factor squared (the
    projector input after a pixel shuffle, Muse Spark's `out_hidden_size`): (node, field, factor), to keep so."""
    vision = getattr(config, "vision_config", None)
    width = vars(vision).get("hidden_size") if vision is not None and is_config(vision) else None
    merge = next((v for k in MERGE_KEYS if isinstance(v := vars(vision).get(k), int) and v > 1), None) \
        if isinstance(width, int) else None
    if not merge:
        return []
    return [(node, key, merge * merge) for node in config_nodes(config) if node is not vision and not _layer_count(node)
            for key, value in vars(node).items() if key in MERGED_INPUT_KEYS and value == width * merge * merge]


def _shrink_timm(node) -> None:
    """A timm-wrapped tower (`architecture` + `model_args`): timm builds it, so it is shrunk through the arguments
    its constructor takes, and the config's width is what timm then builds (a width set on the config alone
    disagrees with the tower's output). Without timm it is left as is: building the model names the extra."""
    if not isinstance(getattr(node, "architecture", None), str) or not hasattr(node, "model_args"):
        return
    try:
        import timm
    except ImportError:
        return
    args = dict(TIMM_ARGS)
    while True:
        try:
            tower = timm.create_model(node.architecture, pretrained=False, num_classes=0, **{**(node.model_args or {}), **args})
            break
        except TypeError as err:  # an argument this architecture does not take
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(err))
            if not unknown or unknown.group(1) not in args:
                raise
            del args[unknown.group(1)]
    node.model_args = {**(node.model_args or {}), **args}
    node.hidden_size = int(tower.num_features)


def _layer_count(node) -> int | None:
    for key in LAYER_KEYS:
        value = getattr(node, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _shrink_node(node) -> None:
    overrides = _take_per_layer_overrides(node)
    old_globals = {k: vars(node).get(k) for o in overrides.values() for k in o}
    old_kinds = list(vars(node).get("layer_types") or [])
    old_layers = _layer_count(node)
    old_width = vars(node).get("hidden_size") if isinstance(vars(node).get("hidden_size"), int) else None
    old_heads = next((v for k in HEAD_KEYS if isinstance(v := getattr(node, k, None), int)), None)
    old_head_dim = getattr(node, "head_dim", None)
    if not isinstance(old_head_dim, int) and old_heads:
        width = next((v for k in ("hidden_size", "embed_dim", "d_model") if isinstance(v := getattr(node, k, None), int)), 0)
        old_head_dim = width // old_heads if width else None
    old_dims = {k: v for k, v in vars(node).items() if k.endswith("head_dim") and isinstance(v, int)}
    for key, value in list(vars(node).items()):
        if key.startswith("_") or isinstance(value, bool):
            continue
        new = _shrunk_value(key, value, old_heads)
        if new is not _KEEP:
            setattr(node, key, new)
    _keep_equal_head_dims(node, old_dims)
    if isinstance(vars(node).get("initializer_range"), float) and node.initializer_range < MIN_INIT_RANGE:
        node.initializer_range = INIT_RANGE
    elif str(getattr(node, "model_type", "")).endswith(BRIDGE_SUFFIXES) and old_width and \
            isinstance(vars(node).get("initializer_range"), float):
        # a bridge's layers keep the gain they had at full width: at 0.02 over width 64 Molmo 2's five projector
        # matrices shrank image features to 1e-6 of the text embeddings (blind probe)
        node.initializer_range *= math.sqrt(old_width / WIDTH)
    if "head_dim" in vars(node) and node.head_dim is None and old_heads:
        node.head_dim = HEAD_DIM  # left unset, read as is by code that expects a number (HunYuan-VL's attention)
    kinds = getattr(node, "layer_types", None)
    # sliding settings in force (Step 3.7's sliding heads; not a `use_sliding_window` switched off)
    sliding_fields = [k for k, v in vars(node).items() if "sliding" in k and k != "sliding_window" and v not in (None, False)]
    if "sliding_window" in vars(node) and node.sliding_window is None and (sliding_fields or (
            isinstance(kinds, (list, tuple)) and any("sliding" in str(k) for k in kinds))):
        node.sliding_window = SLIDING_WINDOW  # sliding layers (or sliding settings) with no window set
    new_layers = _layer_count(node)
    if old_layers and new_layers and new_layers != old_layers:
        _shrink_layer_lists(node, old_layers, new_layers)
    if overrides:
        _put_per_layer_overrides(node, overrides, old_globals, _kept_indices(old_kinds, new_layers or 0))
    rope = getattr(node, "rope_parameters", None)
    if isinstance(rope, dict) and old_head_dim:
        setattr(node, "rope_parameters", _rescaled_rope(rope, old_head_dim))


def _keep_equal_head_dims(node, old: dict[str, int]) -> None:
    """A `head_dim` equal to the rotary head dim in the default stays equal to it: DeepSeek-V3's rotary runs over
    `head_dim`, which its config sets to `qk_rope_head_dim`."""
    if "head_dim" in old and old["head_dim"] == old.get("qk_rope_head_dim"):
        node.head_dim = node.qk_rope_head_dim


_KEEP = object()
# (field names, cap): an int field named in one of these sets (no name is in two) and above its cap becomes the cap
_CAPS = (
    (WIDTH_KEYS, WIDTH), (FFN_KEYS, FFN), (MOE_FFN_KEYS, MOE_FFN), (HEAD_KEYS, HEADS), (HEAD_DIM_KEYS, HEAD_DIM),
    (POOLED_KEYS, POOLED_TOKENS), (LAYER_KEYS, LAYERS), (EXPERT_KEYS, EXPERTS), (TOP_K_KEYS, EXPERTS_PER_TOKEN),
    (SHARED_EXPERT_KEYS, 1), (GROUP_KEYS, 1), (POSITION_TABLE_KEYS, POSITION_ROWS),
)


def _cap(key: str) -> int | None:
    """The most an int field named `key` may hold in a twin (None: any)."""
    if key in LORA_RANK_KEYS:
        return LORA_RANK_KEYS[key]
    if key.endswith(("_num_heads", "_n_heads")):
        return HEADS
    if key.endswith("_head_dim"):
        return HEAD_DIM
    return next((cap for keys, cap in _CAPS if key in keys), None)


def _shrunk_value(key: str, value: Any, old_heads: int | None):
    if isinstance(value, int):
        if key in KV_HEAD_KEYS:  # as many as the heads where the model had one per head (no grouping), else few
            return HEADS if old_heads and value >= old_heads else min(value, 2)
        cap = _cap(key)
        if cap is not None and value > cap:
            return cap
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if key in MOE_FFN_KEYS:
            return [min(v, MOE_FFN) for v in value]
        if key in FFN_KEYS:
            return [min(v, FFN) for v in value]
    return _KEEP


def _shrink_layer_lists(node, old: int, new: int) -> None:
    """Per-layer lists cut to the new depth (every distinct kind kept); layer-index lists mapped onto it; counts of
    trailing layers scaled to it (at least one layer of each kind left before them)."""
    for key, value in list(vars(node).items()):
        if key in LAYER_SUBSET_KEYS and isinstance(value, int) and not isinstance(value, bool):
            kinds = len(set(getattr(node, "layer_types", None) or [None]))
            setattr(node, key, max(0, min(value * new // old, new - kinds)))
        if key.endswith(LAYER_INDEX_SUFFIXES) and isinstance(value, int) and not isinstance(value, bool):
            setattr(node, key, _mapped_indices([value], old, new)[0])
        if key.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        if key in INDEX_LIST_KEYS:
            setattr(node, key, type(value)(_mapped_indices(list(value), old, new)))
        elif len(value) == old:
            setattr(node, key, type(value)(_cut_keeping_kinds(list(value), new)))


def _cut_keeping_kinds(values: list, new: int) -> list:
    return [values[i] for i in _kept_indices(values, new)]


def _kept_indices(values: list, new: int) -> list[int]:
    """The old layers a cut to `new` layers keeps: the first ones, the last replaced by the first layer of each kind
    they miss (the first layer's kind kept)."""
    head = list(range(min(new, len(values)))) if values else list(range(new))
    if not values:
        return head
    firsts = {}
    for i, v in enumerate(values):
        firsts.setdefault(v, i)
    missing = [k for k in firsts if k not in values[:new] and not isinstance(k, (int, float))]
    for k, kind in enumerate(missing[: new - 1]):  # replace from the end, keeping the first layer's kind
        head[new - 1 - k] = firsts[kind]
    return head


def _take_per_layer_overrides(node) -> dict[int, dict]:
    """A heterogeneous config's per-layer overrides (layer -> {field: value}), taken off it so that its global
    fields read and shrink plainly; {} for a homogeneous one."""
    spec = vars(node).get("_heterogeneity_spec")
    if spec is None:
        return {}
    overrides = {int(i): dict(o) for i, o in spec.per_layer_overrides.items()}
    node.per_layer_config = None
    return overrides


def _put_per_layer_overrides(node, overrides: dict[int, dict], old_globals: dict, kept: list[int]) -> None:
    """Overrides back on the layers the cut kept: a number above its global scaled as the global was (a 512 head dim
    over a global 256 stays twice the shrunk global), one below capped like any field; where the cut kept no overridden layer, its last layer takes the first
    override, so the twin stays heterogeneous."""
    if not any(i in overrides for i in kept) and kept:
        kept = kept[:-1] + [min(overrides)]
    shrunk = {}
    for new, old in enumerate(kept):
        if old not in overrides:
            continue
        layer = {}
        for key, value in overrides[old].items():
            was, now = old_globals.get(key), vars(node).get(key)
            scalable = all(isinstance(v, int) and not isinstance(v, bool) for v in (value, was, now)) and was
            if scalable and value > was:  # larger than the global: as much larger
                layer[key] = round(now * value / was)
            else:  # smaller (fewer experts or heads): capped like the global, never below what the cap allows
                new_value = _shrunk_value(key, value, None)
                layer[key] = value if new_value is _KEEP else new_value
        shrunk[new] = layer
    node.per_layer_config = shrunk


def _mapped_indices(values: list, old: int, new: int) -> list:
    out = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            return values
        if v < 0:
            out.append(max(v, -new))
        else:
            out.append(min(new - 1, (v * new) // max(old, 1)))
    return sorted(set(out), key=out.index) if len(out) > new else out


def _fix_feature_layers(config) -> None:
    """Feature-layer indices on the top config, or a sibling of the vision config (Molmo 2's `adapter_config`),
    point into the vision side: keep them inside its new depth."""
    vision = getattr(config, "vision_config", None)
    depth = _layer_count(vision) if vision is not None else None
    if not depth:
        return
    for node, key in [(n, k) for n in config_nodes(config) if n is not vision
                      for k in ("vision_feature_layer", "vision_feature_layers", "vit_layer",
                                *(k for k in vars(n) if k.endswith(LAYER_INDEX_SUFFIXES)))]:
        value = getattr(node, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(node, key, max(value, -depth) if value < 0 else min(value, depth - 1))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
            setattr(node, key, type(value)(max(v, -depth) if v < 0 else min(v, depth - 1) for v in value))


def _rescaled_rope(rope: dict, old_head_dim: int) -> dict:
    """Rotary sections (M-RoPE) summing to the old head's half-dim, rescaled to the new one."""
    if rope and all(isinstance(v, dict) for v in rope.values()):  # one set per attention kind
        return {kind: _rescaled_rope(inner, old_head_dim) for kind, inner in rope.items()}
    rope = dict(rope)
    for key in ("mrope_section", "section"):
        sections = rope.get(key)
        if isinstance(sections, list) and sections and all(isinstance(s, int) for s in sections):
            total = sum(sections)
            target = max(len(sections), round(total * HEAD_DIM / old_head_dim))
            scaled = [max(1, math.floor(s * target / total)) for s in sections]
            scaled[-1] += target - sum(scaled)
            rope[key] = scaled
    return rope
