"""The prompt cache (adapters/prompt_cache.py): rows kept by content across steps, joined exactly as the processor
encodes rows together, bounded by bytes; and the fast (torchvision) image processors against the slow (PIL) ones."""

from __future__ import annotations

import pytest
import torch
import transformers
from PIL import ImageDraw

from tests.adapters.samples import picture, user_turn
from tests.conftest import tiny_adapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.prompt_cache import PromptCache, batch_bytes

# layouts: flat patches (qwen2_5_vl), one padded row of tiles per sample (idefics3, smolvlm), tiles (internvl),
# fixed-size images (hybrid_llava)
FAMILIES = ["qwen2_5_vl", "idefics3", "smolvlm", "internvl", "hybrid_llava"]


def _rows(n_images=(1, 2, 1)):
    images = [[picture(56 + 28 * ((k + i) % 3), 56 + 28 * (k % 2), 10 * i + k) for k in range(n)]
              for i, n in enumerate(n_images)]
    texts = ["How many red squares?", "Which picture is wider? Answer briefly.", "Count the blue squares."]
    return [user_turn(len(imgs), t) for imgs, t in zip(images, texts)], images


def assert_same(a: PromptBatch, b: PromptBatch) -> None:
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert a.mm.keys() == b.mm.keys() and a.mm_rows == b.mm_rows and a.token_keys == b.token_keys
    for key in a.mm:
        assert a.mm[key].dtype == b.mm[key].dtype and torch.equal(a.mm[key], b.mm[key]), key
    assert a.meta.keys() == b.meta.keys() and all(torch.equal(a.meta[k], b.meta[k]) for k in a.meta)
    assert a.image_spans == b.image_spans


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_and_fresh_rows_give_the_batch_encoded_together(family):
    adapter = tiny_adapter(family)
    conversations, images = _rows()
    together = adapter.encode_prompts(conversations, images)
    cache = PromptCache.of_mib(64)
    adapter.encode_prompts([conversations[0], conversations[2]], [images[0], images[2]], cache=cache)
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 2)
    mixed = adapter.encode_prompts(conversations, images, cache=cache)  # rows 0 and 2 cached, row 1 encoded
    assert (cache.hits, cache.misses) == (2, 3)
    assert_same(mixed, together)
    assert_same(adapter.encode_prompts(conversations, images, cache=cache), together)  # all three cached
    assert cache.hits == 5
    reordered = adapter.encode_prompts(conversations[::-1], images[::-1], cache=cache)
    assert_same(reordered, adapter.encode_prompts(conversations[::-1], images[::-1]))


def test_the_cached_batch_gives_the_same_logprobs():
    from vlm_grpo.grpo.logprobs.completions import completion_logprobs

    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows()
    cache = PromptCache.of_mib(64)
    adapter.encode_prompts(conversations[1:], images[1:], cache=cache)
    cached, together = adapter.encode_prompts(conversations, images, cache=cache), adapter.encode_prompts(conversations, images)
    completion = torch.randint(10, 100, (3, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = completion_logprobs(adapter, cached, completion, torch.ones_like(completion))
        b = completion_logprobs(adapter, together, completion, torch.ones_like(completion))
    assert torch.equal(a, b)


def _edit(img):
    ImageDraw.Draw(img).point((3, 3), fill=(1, 2, 3))


@pytest.mark.parametrize("change", ["edited in place", "another image of the same size", "other text",
                                    "processor setting"])
def test_a_changed_row_misses(change):
    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows((1,))
    cache = PromptCache.of_mib(64)
    first = adapter.encode_prompts(conversations, images, cache=cache)
    processor = adapter.processor.image_processor
    before = dict(processor.size)
    if change == "edited in place":
        _edit(images[0][0])
    elif change == "another image of the same size":
        images = [[picture(images[0][0].width, images[0][0].height, 99)]]
    elif change == "other text":
        conversations = [user_turn(1, "Count the green squares.")]
    else:
        processor.size = {**before, "longest_edge": 28 * 28 * 2}  # fewer patches per image
    try:
        again = adapter.encode_prompts(conversations, images, cache=cache)
        assert (cache.hits, cache.misses) == (0, 2)
        assert_same(again, adapter.encode_prompts(conversations, images))
    finally:
        processor.size = before
    assert not (torch.equal(again.input_ids, first.input_ids) and torch.equal(again.mm["pixel_values"],
                                                                               first.mm["pixel_values"]))


def test_the_caller_cannot_change_what_is_cached():
    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows((1,))
    cache = PromptCache.of_mib(64)
    fresh = adapter.encode_prompts(conversations, images)
    for _ in range(2):  # a miss, then a hit: each batch handed out is the caller's own
        batch = adapter.encode_prompts(conversations, images, cache=cache)
        batch.input_ids.zero_()
        batch.mm["pixel_values"].zero_()
    assert_same(adapter.encode_prompts(conversations, images, cache=cache), fresh)


def test_zero_megabytes_keeps_nothing():
    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows()
    cache = PromptCache.of_mib(0)
    assert not cache.enabled
    batch = adapter.encode_prompts(conversations, images, cache=cache)
    assert_same(batch, adapter.encode_prompts(conversations, images))
    assert (len(cache), cache.bytes, cache.hits, cache.misses) == (0, 0, 0, 0)


def test_the_bound_evicts_the_least_recently_used_rows():
    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows((1, 1, 1))
    rows = [adapter.encode_prompts([c], [i]) for c, i in zip(conversations, images)]
    sizes = [batch_bytes(r) for r in rows]
    cache = PromptCache(sizes[0] + sizes[1] + min(sizes[2], sizes[0]) - 1)  # room for two of the three rows
    for k in (0, 1):
        adapter.encode_prompts([conversations[k]], [images[k]], cache=cache)
    adapter.encode_prompts([conversations[0]], [images[0]], cache=cache)  # row 0 used last: row 1 is the oldest
    assert cache.hits == 1
    adapter.encode_prompts([conversations[2]], [images[2]], cache=cache)
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes
    hits = cache.hits
    adapter.encode_prompts([conversations[0]], [images[0]], cache=cache)
    assert cache.hits == hits + 1  # row 0 kept
    adapter.encode_prompts([conversations[1]], [images[1]], cache=cache)
    assert cache.hits == hits + 1  # row 1 was evicted
    assert cache.bytes == sum(batch_bytes(row) for row, _ in cache._rows.values()) <= cache.max_bytes


def test_a_row_larger_than_the_bound_is_not_kept():
    adapter = tiny_adapter("qwen2_5_vl")
    conversations, images = _rows((1,))
    cache = PromptCache(16)
    assert_same(adapter.encode_prompts(conversations, images, cache=cache), adapter.encode_prompts(conversations, images))
    assert (len(cache), cache.bytes) == (0, 0)


def test_a_family_that_cannot_join_rows_encodes_them_together():
    adapter = tiny_adapter("mllama")
    assert not adapter.joins_encoded_rows
    conversations, images = _rows((1, 1, 1))
    cache = PromptCache.of_mib(64)
    assert_same(adapter.encode_prompts(conversations, images, cache=cache), adapter.encode_prompts(conversations, images))
    assert len(cache) == 0


def test_rows_with_other_image_sizes_padded_together_are_encoded_together():
    adapter = tiny_adapter("mistral3")  # pixtral pads every image to the batch's largest
    conversations, images = _rows((1, 1, 1))
    cache = PromptCache.of_mib(64)
    rows = [adapter.encode_prompts([c], [i]) for c, i in zip(conversations, images)]
    assert not adapter.can_join(rows)
    assert_same(adapter.encode_prompts(conversations, images, cache=cache), adapter.encode_prompts(conversations, images))
    # the run's rows are encoded together from then on (once each, not alone and then again together)
    calls = []
    real = adapter._run_processor
    adapter._run_processor = lambda *a, **k: calls.append(len(a[0])) or real(*a, **k)
    try:
        adapter.encode_prompts(conversations, [[img.rotate(90)] for (img,) in images], cache=cache)  # new rows
    finally:
        del adapter._run_processor
    assert calls == [3] and len(cache) == 0 and not cache.enabled


# ---------------------------------------------------------------- fast (torchvision) against slow (PIL) processors
@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm", "hybrid_llava", "internvl", "gemma3", "mistral3"])
def test_fast_image_processor_matches_the_slow_one(family):
    """Within one 8-bit intensity step per value (the PIL path resizes in uint8, the torchvision one in float), and
    within 0.05 of a step on average; counts, grids and masks equal. docs/performance.md states the same."""
    fast = tiny_adapter(family).processor.image_processor
    assert type(fast).__name__ + "Pil" in dir(transformers), "the family's processor has a PIL twin"
    config = {k: v for k, v in fast.to_dict().items() if k != "image_processor_type"}
    slow = getattr(transformers, type(fast).__name__ + "Pil").from_dict(config)
    image = picture(100, 76, 3)  # not a multiple of any patch or tile: both resize
    a, b = fast(images=[image], return_tensors="pt"), slow(images=[image], return_tensors="pt")
    assert a.keys() == b.keys()
    step = fast.rescale_factor / min(fast.image_std)  # one 8-bit level after normalisation
    for key in a:
        x, y = torch.as_tensor(a[key]), torch.as_tensor(b[key])
        assert x.shape == y.shape, key
        if x.is_floating_point():
            diff = (x.double() - y.double()).abs()
            assert diff.max().item() <= step * 1.001, key
            assert diff.mean().item() <= 0.05 * step, key
        else:
            assert torch.equal(x, y), key
