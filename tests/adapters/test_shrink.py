"""Tiny-twin configs (adapters/generic/shrink.py): fields that must agree with each other after shrinking do.

Config-level checks only (no model is built here but a timm tower): each rule was found on a model type whose twin
failed without it, named beside the check.
"""

from __future__ import annotations

from vlm_grpo.adapters.generic.shrink import INIT_RANGE, LAYERS, POOLED_TOKENS, POSITION_ROWS, WIDTH, shrink_config
from vlm_grpo.adapters.generic.twin_model import default_config


def _shrunk(model_type: str):
    config = default_config(model_type)  # the type's defaults, an optional vision part included
    shrink_config(config)
    return config


def test_a_layer_index_field_points_inside_the_new_depth():
    """MiniCPM-V 4.6: `insert_layer_id` 6 of 2 layers meant the vision merger never ran (images bled together)."""
    config = _shrunk("minicpmv4_6")
    assert config.vision_config.num_hidden_layers == LAYERS
    assert 0 <= config.insert_layer_id < LAYERS and config.vision_config.insert_layer_id == config.insert_layer_id


def test_heterogeneous_layers_stay_heterogeneous_within_the_new_depth():
    """Gemma 4 unified: per-layer head dims (512 on full-attention layers over a global 256)."""
    text = _shrunk("gemma4_unified").text_config
    overrides = text._heterogeneity_spec.per_layer_overrides
    assert text.num_hidden_layers == LAYERS and overrides and all(0 <= i < LAYERS for i in overrides)
    text.allow_global_per_layer_attribute_access = True
    assert [o["head_dim"] for o in overrides.values()] == [2 * text.head_dim] * len(overrides)


def test_a_head_dim_that_was_the_rotary_head_dim_stays_it():
    """Kimi K2.5's DeepSeek-V3 text model runs its rotary over `head_dim` (= `qk_rope_head_dim` by default)."""
    text = _shrunk("kimi_k25").text_config
    assert text.head_dim == text.qk_rope_head_dim < 64


def test_a_projector_input_after_a_pixel_shuffle_keeps_the_merge_factor():
    """Muse Spark: the vision tower hands the adapter hidden x merge^2 features."""
    config = _shrunk("muse_spark")
    merge = config.vision_config.merge_size
    assert config.vision_config.hidden_size == WIDTH and config.out_hidden_size == WIDTH * merge * merge
    glm = _shrunk("glm5_next")  # a text width equal to that product by chance is a width like any other
    assert glm.text_config.hidden_size == WIDTH


def test_a_vanishing_init_range_is_raised():
    """GOT-OCR2's vision config initialises with std 1e-10: the image moved the logits by 1e-20 (blind probe)."""
    assert _shrunk("got_ocr2").vision_config.initializer_range == INIT_RANGE


def test_a_timm_tower_is_shrunk_through_timm_and_its_width_follows():
    """Gemma 3n: MobileNetV5 through timm; the config's width must be what timm builds (2048 here)."""
    import timm  # the `timm` extra (in the lock and the dev extra)
    config = _shrunk("gemma3n")
    vision = config.vision_config
    tower = timm.create_model(vision.architecture, pretrained=False, num_classes=0, **vision.model_args)
    assert vision.hidden_size == tower.num_features
    assert sum(p.numel() for p in tower.parameters()) < 10_000_000  # the real encoder is 300M
    assert config.vision_soft_tokens_per_image == POOLED_TOKENS
    assert config.text_config.hidden_size_per_layer_input <= WIDTH


def test_the_vision_embedder_widths_and_position_table_shrink_with_the_rest():
    """Gemma 4 unified: `mm_embed_dim`, `output_proj_dims` (3840) and `mm_posemb_size` (1120 rows) were left at the
    default, a 35M-parameter twin that took 6 s to build; positions past the table are clamped to its last row."""
    vision = _shrunk("gemma4_unified").vision_config
    assert vision.mm_embed_dim == vision.output_proj_dims == WIDTH
    assert vision.mm_posemb_size == POSITION_ROWS


def test_a_high_res_towers_output_channels_shrink():
    """DeepSeek-VL hybrid's SAM tower: `output_channels` 256 (its projection convs widen it 2x and 4x) made a 7.7M
    parameter twin; at the shared width it has 1M."""
    assert _shrunk("deepseek_vl_hybrid").high_res_vision_config.output_channels == WIDTH


def test_tile_layouts_follow_the_twins_tile_size():
    """LLaVA-NeXT's `image_grid_pinpoints` (multiples of its 336 px tiles): the same layouts of the twin's tiles,
    so an image is cut into as few tiles as on the real model, not 19."""
    from vlm_grpo.adapters.generic.twin import set_vision_image_size

    config = default_config("llava_next")
    real = [list(p) for p in config.image_grid_pinpoints]
    tile = config.vision_config.image_size
    set_vision_image_size(config, 112)
    assert config.vision_config.image_size == 112
    assert config.image_grid_pinpoints == [[h // tile * 112, w // tile * 112] for h, w in real]
