"""InternVL adapter on its tiny twin: tiles, alignment, grouping, generation and teacher forcing."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np
import pytest
import torch
from PIL import Image

from vlm_grpo.adapters.base import ImageTokenMismatch
from vlm_grpo.adapters.families.internvl import InternVLAdapter
from vlm_grpo.adapters.twins.internvl import INTERNVL_VOCAB

torch.set_num_threads(1)


def _image(w, h, seed):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (h, w, 3), dtype=np.uint8))


def _conv(n_images, text):
    return [{"role": "user", "content": [*([{"type": "image"}] * n_images), {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def adapter():
    return InternVLAdapter.tiny(seed=0)


@pytest.fixture(scope="module")
def batch(adapter):
    # 56x56 -> 1 tile; 112x56 -> 2 tiles + thumbnail; 112x112 -> 4 tiles + thumbnail.
    return adapter.encode_prompts(
        [_conv(1, "How many red circles?"), _conv(2, "Count the squares."), _conv(1, "Is the cat left?")],
        [[_image(56, 56, 0)], [_image(112, 56, 1), _image(112, 112, 2)], [_image(112, 56, 3)]],
    )


def test_tiles_and_feature_counts(adapter, batch):
    assert batch.mm["pixel_values"].shape == (12, 3, 56, 56)
    assert batch.mm_rows["pixel_values"] == [1, 8, 3]
    assert [adapter.tiles_per_image(batch, i) for i in range(3)] == [[1], [3, 5], [3]]
    assert batch.images_per_sample == [1, 2, 1]
    n_tok = (batch.input_ids == adapter.image_token_id).sum(dim=1).tolist()
    assert adapter.feature_counts(batch) == n_tok == [4, 32, 12]
    assert adapter.image_grid(batch, 1, 1) == (2, 2)
    for row, spans in zip(batch.input_ids, batch.image_spans):
        for start, end in spans:  # each span is one image's IMG_CONTEXT run, framed by <img> ... </img>
            assert (row[start:end] == adapter.image_token_id).all()
            assert adapter.tokenizer.convert_ids_to_tokens([int(row[start - 1]), int(row[end])]) == ["<img>", "</img>"]


def test_tampered_prompt_is_caught(adapter, batch):
    bad = batch.select([0, 1, 2])
    ids = bad.input_ids.clone()
    start, _ = bad.image_spans[1][0]
    ids[1, start] = adapter.tokenizer.convert_tokens_to_ids("a")
    bad.input_ids = ids
    with pytest.raises(ImageTokenMismatch, match="sample 1"):
        adapter.check_alignment(bad)


def test_suppressed_and_special_tokens(adapter):
    tok = adapter.tokenizer
    names = tok.convert_ids_to_tokens(adapter.suppressed_token_ids())
    assert sorted(names) == sorted(["<IMG_CONTEXT>", "<img>", "</img>", "<video>"])
    assert tok.convert_ids_to_tokens(adapter.eos_token_ids) == ["<|im_end|>"]
    assert tok.padding_side == "left"


def test_repeat_groups_tiles(adapter, batch):
    rep = batch.repeat(2)
    assert rep.mm_rows["pixel_values"] == [1, 1, 8, 8, 3, 3]
    assert torch.equal(rep.mm["pixel_values"][2:10], batch.mm["pixel_values"][1:9])
    assert torch.equal(rep.mm["pixel_values"][10:18], batch.mm["pixel_values"][1:9])
    adapter.check_alignment(rep)


@pytest.mark.parametrize("use_cache", [False, True])
def test_generate_and_teacher_forced_logprobs(adapter, batch, use_cache):
    rep = batch.repeat(2)
    T = 4
    out = adapter.generate(rep, max_new_tokens=T, min_new_tokens=T, use_cache=use_cache, output_logits=True)
    L = rep.input_ids.shape[1]
    completion = out.sequences[:, L:]
    assert completion.shape == (len(rep), T)
    assert not torch.isin(completion, torch.tensor(adapter.suppressed_token_ids())).any()
    gen_logp = torch.stack(out.logits, dim=1).log_softmax(-1).gather(-1, completion[..., None])[..., 0]

    inputs = adapter.completion_inputs(rep, completion, torch.ones_like(completion))
    with torch.no_grad():
        logits = adapter.model(**inputs).logits
    tf_logp = logits[:, L - 1 : L + T - 1].log_softmax(-1).gather(-1, completion[..., None])[..., 0]
    torch.testing.assert_close(tf_logp, gen_logp, atol=1e-4, rtol=0)


def test_module_groups_cover_every_parameter(adapter):
    groups = adapter.module_groups()
    names = [n for ns in groups.values() for n in ns]
    assert sorted(names) == sorted(n for n, _ in adapter.model.named_parameters())
    assert all(groups[g] for g in ("vision", "projector", "language", "head"))


def test_tiny_build_is_deterministic(adapter):
    again = InternVLAdapter.tiny(seed=0)
    other = InternVLAdapter.tiny(seed=1)
    a, b, c = (dict(m.model.state_dict()) for m in (adapter, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_save_load_round_trip(adapter, batch, tmp_path):
    adapter.save(tmp_path)
    loaded = InternVLAdapter.load(str(tmp_path), dtype=torch.float32)
    assert type(loaded.processor) is type(adapter.processor)
    again = loaded.encode_prompts(
        [_conv(1, "How many red circles?"), _conv(2, "Count the squares."), _conv(1, "Is the cat left?")],
        [[_image(56, 56, 0)], [_image(112, 56, 1), _image(112, 112, 2)], [_image(112, 56, 3)]],
    )
    assert torch.equal(again.input_ids, batch.input_ids)
    assert torch.equal(again.mm["pixel_values"], batch.mm["pixel_values"])
    assert again.mm_rows == batch.mm_rows
    with torch.no_grad():
        expected = adapter.model(**batch.model_inputs()).logits
        torch.testing.assert_close(loaded.model(**again.model_inputs()).logits, expected)


def test_real_size_preset_builds_on_meta_device():
    with torch.device("meta"):  # the real preset path, without allocating ~1.9 GB of bf16 weights
        preset = InternVLAdapter.preset("internvl3_1b")
    assert preset.model.dtype == torch.bfloat16
    assert preset.model.config.image_seq_length == preset.processor.image_seq_length == preset.image_seq_length == 256
    assert preset.model.config.text_config.vocab_size == INTERNVL_VOCAB
    n_params = sum(p.numel() for p in preset.model.parameters())
    assert 0.93e9 < n_params < 0.945e9  # InternVL3-1B: ~938M (lm_head untied)
    groups = preset.module_groups()
    assert all(groups[g] for g in groups)
