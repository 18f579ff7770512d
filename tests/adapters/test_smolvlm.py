"""Idefics3 and SmolVLM adapters on their tiny twins: tiles, alignment, generation, log-probs, save/load."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch
from PIL import Image

from vlm_grpo.adapters.base import ImageTokenMismatch
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.families.idefics3 import Idefics3Adapter, TileGrid
from vlm_grpo.adapters.families.smolvlm import SmolVLMAdapter
from vlm_grpo.adapters.twins.idefics3 import ROW_COL_TOKENS

torch.set_num_threads(1)

FAMILIES = [Idefics3Adapter, SmolVLMAdapter]
SEQ_LEN = 4  # (32/8)^2 / 2^2
# (width, height) per image. Every image is first resized to a 64-px longest edge, then cut into
# 32-px tiles: square -> 2x2 (+ global = 5 tiles), tall -> 2x1, wide -> 1x2 (3 tiles each).
SIZES = [[(64, 64)], [(32, 64), (64, 32)], [(64, 20)]]
TILES = [5, 6, 3]
GRIDS = [[(2, 2)], [(2, 1), (1, 2)], [(1, 2)]]
T = 4  # generated tokens


def conversation(n_images: int, text: str = "How many red shapes are in the image?"):
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]


def noise_image(size: tuple[int, int], seed: int) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    w, h = size
    return Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy())


def sample_inputs():
    convs = [conversation(len(s)) for s in SIZES]
    images = [[noise_image(size, 10 * i + j) for j, size in enumerate(s)] for i, s in enumerate(SIZES)]
    return convs, images


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda c: c.family)
def adapter(request):
    return request.param.tiny(seed=0)


@pytest.fixture(scope="module")
def batch(adapter) -> PromptBatch:
    return adapter.encode_prompts(*sample_inputs())


def greedy(adapter, batch, use_cache=True):
    out = adapter.generate(batch, max_new_tokens=T, min_new_tokens=T, use_cache=use_cache, output_logits=True)
    completion = out.sequences[:, batch.input_ids.shape[1] :]
    return completion, torch.stack(out.logits, dim=1).float().log_softmax(-1)


def teacher_forced(adapter, batch, completion):
    inputs = adapter.completion_inputs(batch, completion, torch.ones_like(completion))
    length = batch.input_ids.shape[1]
    with torch.no_grad():
        logits = adapter.model(**inputs).logits
    return logits[:, length - 1 : length + T - 1].float().log_softmax(-1)


def test_chat_template_renders_the_family_format(adapter):
    text = adapter.processor.apply_chat_template(conversation(1, "Hi"), add_generation_prompt=True, tokenize=False)
    prefix = adapter.spec.prefix
    assert text == f"{prefix}User:<image>Hi<end_of_utterance>\nAssistant:"
    text_only = adapter.processor.apply_chat_template(conversation(0, "Hi"), add_generation_prompt=True, tokenize=False)
    assert text_only == f"{prefix}User: Hi<end_of_utterance>\nAssistant:"


def test_special_tokens_are_single_and_seq_len_consistent(adapter):
    tok = adapter.tokenizer
    for token in ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>", *ROW_COL_TOKENS]:
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    cfg = adapter.model.config
    expected = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2 // cfg.scale_factor**2
    assert adapter.image_seq_len == adapter.processor.image_seq_len == expected == SEQ_LEN


def test_tiles_are_padded_per_sample_and_masked(adapter, batch):
    pixels, mask = batch.mm["pixel_values"], batch.mm["pixel_attention_mask"]
    assert pixels.shape == (3, max(TILES), 3, 32, 32)
    assert mask.shape == (3, max(TILES), 32, 32)
    assert batch.mm_rows == {"pixel_values": [1, 1, 1], "pixel_attention_mask": [1, 1, 1]}
    assert mask.flatten(2).any(dim=2).sum(dim=1).tolist() == TILES
    for i, n in enumerate(TILES):
        assert pixels[i, n:].eq(0).all() and not mask[i, n:].any()  # padding tiles: zero pixels, masked out
    assert adapter.real_tiles(batch) == TILES


def test_feature_counts_spans_and_grids(adapter, batch):
    tokens = (batch.input_ids == adapter.image_token_id).sum(dim=1).tolist()
    assert adapter.feature_counts(batch) == tokens == [n * SEQ_LEN for n in TILES]
    assert batch.images_per_sample == [1, 2, 1]
    for i, grids in enumerate(GRIDS):
        for j, (rows, cols) in enumerate(grids):
            start, end = batch.image_spans[i][j]
            span = batch.input_ids[i, start:end]
            assert span[0] == span[-1] == adapter.image_token_id
            assert (span == adapter.image_token_id).sum() == (rows * cols + 1) * SEQ_LEN
            assert adapter.image_grid(batch, i, j) == TileGrid(rows, cols, 2)


def test_tampered_prompt_is_caught(adapter, batch):
    ids = batch.input_ids.clone()
    first_image_token = (ids[2] == adapter.image_token_id).nonzero()[0, 0]
    ids[2, first_image_token] = adapter.tokenizer.convert_tokens_to_ids("<fake_token_around_image>")
    tampered = PromptBatch(ids, batch.attention_mask, batch.mm, batch.mm_rows, batch.image_spans)
    with pytest.raises(ImageTokenMismatch, match="sample 2"):
        adapter.check_alignment(tampered)


def test_suppressed_ids_cover_image_delimiters(adapter):
    ids = set(adapter.suppressed_token_ids())
    convert = adapter.tokenizer.convert_tokens_to_ids
    expected = {convert(t) for t in ["<image>", "<fake_token_around_image>", "<global-img>", *ROW_COL_TOKENS]}
    assert expected <= ids
    assert convert("<end_of_utterance>") not in ids and adapter.eos_token_ids == [convert("<end_of_utterance>")]


def test_select_and_repeat_keep_samples_working(adapter, batch):
    grouped = batch.repeat(2)
    assert grouped.mm["pixel_values"].shape[0] == 6
    assert adapter.feature_counts(grouped) == [n * SEQ_LEN for n in TILES for _ in range(2)]
    adapter.check_alignment(grouped)
    single = batch.select([2])  # keeps the batch's tile padding; the model must skip those tiles
    completion, _ = greedy(adapter, single)
    assert completion.shape == (1, T)


def test_cache_and_teacher_forced_logprobs_agree(adapter, batch):
    grouped = batch.repeat(2)
    uncached, uncached_lp = greedy(adapter, grouped, use_cache=False)
    cached, cached_lp = greedy(adapter, grouped, use_cache=True)
    assert torch.equal(uncached, cached)
    assert (cached_lp - uncached_lp).abs().max() < 1e-4
    forced = teacher_forced(adapter, grouped, cached)
    assert (forced - cached_lp).abs().max() < 1e-4
    # Control: the comparison is not blind to images (new pixels in sample 0's real tiles).
    pixels = grouped.mm["pixel_values"].clone()
    pixels[0] = torch.randn_like(pixels[0]) * grouped.mm["pixel_attention_mask"][0, :, None]
    swapped = PromptBatch(
        grouped.input_ids, grouped.attention_mask, {**grouped.mm, "pixel_values": pixels}, grouped.mm_rows,
        grouped.image_spans,
    )
    # Every decode step must feel the image, else a cache that dropped it after step 1 would go unseen.
    per_step = (teacher_forced(adapter, swapped, cached)[0] - forced[0]).abs().amax(dim=-1)
    assert (per_step > 1e-4).all(), per_step


def test_left_padded_batch_equals_one_by_one(adapter, batch):
    completion, logprobs = greedy(adapter, batch)
    convs, images = sample_inputs()
    for i in range(len(convs)):
        alone = adapter.encode_prompts([convs[i]], [images[i]])
        one_completion, one_logprobs = greedy(adapter, alone)
        assert torch.equal(one_completion[0], completion[i])
        assert (one_logprobs[0] - logprobs[i]).abs().max() < 1e-4


def test_text_only_samples(adapter):
    convs, images = sample_inputs()
    mixed = adapter.encode_prompts([convs[0], conversation(0)], [images[0], []])
    assert adapter.feature_counts(mixed) == [TILES[0] * SEQ_LEN, 0]
    assert mixed.image_spans[1] == []
    completion, logprobs = greedy(adapter, mixed.select([1]))  # only padding tiles left
    assert (teacher_forced(adapter, mixed.select([1]), completion) - logprobs).abs().max() < 1e-4


def test_module_groups_cover_every_parameter(adapter):
    groups = adapter.module_groups()
    names = [n for n, _ in adapter.model.named_parameters()]
    assert sorted(n for g in groups.values() for n in g) == sorted(names)
    assert all(groups[g] for g in ("vision", "projector", "language", "head"))
    assert groups["head"] == ["lm_head.weight"]
    assert all(n.startswith("model.connector.") for n in groups["projector"])


def test_save_load_round_trip(adapter, batch, tmp_path):
    adapter.save(tmp_path)
    loaded = type(adapter).load(str(tmp_path), dtype=torch.float32)
    assert type(loaded.processor) is type(adapter.processor)
    again = loaded.encode_prompts(*sample_inputs())
    assert torch.equal(again.input_ids, batch.input_ids)
    with torch.no_grad():
        before = adapter.model(**batch.model_inputs()).logits
        after = loaded.model(**again.model_inputs()).logits
    assert torch.allclose(before, after, atol=1e-5)


def test_tiny_is_deterministic():
    a, b = SmolVLMAdapter.tiny(seed=0), SmolVLMAdapter.tiny(seed=0)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    c = SmolVLMAdapter.tiny(seed=1)
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)


def test_smolvlm_256m_preset_architecture():
    with torch.device("meta"):  # the shapes, without allocating 256M weights
        adapter = SmolVLMAdapter.preset("smolvlm_256m")
    assert sum(p.numel() for p in adapter.model.parameters()) == 256_484_928
    assert adapter.model.dtype == torch.bfloat16
    assert adapter.image_seq_len == adapter.processor.image_seq_len == 64
    assert adapter.processor.image_processor.max_image_size == {"longest_edge": 512}
