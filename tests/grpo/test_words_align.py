"""The align stage's words method (vlm_grpo/experiment/words.py): the projector learns to put each image token at the
LM's embedding of its cell's words, the LM stays untouched, and the model is saved where the SFT stage reads it."""

from __future__ import annotations

import math

import pytest
import torch

from vlm_grpo.adapters.twins.hybrid_llava import TINY_LM
from vlm_grpo.adapters.twins.qwen2_5_vl import qwen2_lm
from vlm_grpo.compose import compose
from vlm_grpo.experiment.stages import random_tower
from vlm_grpo.experiment.tower import pretrain_tower
from vlm_grpo.experiment.words import align_to_words, image_tokens, word_vector
from vlm_grpo.grpo.checkpoint.manifest import verify
from vlm_grpo.loader import load_model
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.scene_count import cell_labels, cell_words, scene

TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
             patch_size=8)
OPTIONS = {"image_size": 32, "task": "caption"}


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    root = tmp_path_factory.mktemp("words")
    tower = random_tower(root / "tower", TOWER, seed=0)
    pretrain_tower(tower, get_recipe("scene_count"), OPTIONS, steps=40, batch_size=32, learning_rate=3e-3, seed=0,
                   say=lambda _: None)
    lm, tokenizer = qwen2_lm(dict(TINY_LM, tie_word_embeddings=True), 4)
    lm.save_pretrained(root / "lm")
    tokenizer.save_pretrained(root / "lm")
    return compose(str(tower), str(root / "lm"), str(root / "model"), seed=0)


def test_cell_words_name_each_cell():
    import random

    shapes = scene(random.Random(5), ood=False)
    words, labels = cell_words(shapes), cell_labels(shapes)
    assert len(words) == len(labels) == 16
    assert [w == "empty" for w in words] == [v == 0 for v in labels]
    for shape in shapes:
        assert f"{shape.colour} {shape.kind}" in words


def test_a_word_vector_sums_the_tokens_and_keeps_one_words_norm():
    embeddings = torch.randn(10, 4)

    class Tokenizer:
        def __call__(self, text, add_special_tokens):
            return {"input_ids": {" red circle": [2, 7], " empty": [3]}[text]}

    assert torch.allclose(word_vector(embeddings, Tokenizer(), "red circle"), (embeddings[2] + embeddings[7]) / math.sqrt(2))
    assert torch.equal(word_vector(embeddings, Tokenizer(), "empty"), embeddings[3])


def test_the_projector_learns_the_words_and_nothing_else_moves(composed, tmp_path):
    said = []
    facts = align_to_words(composed, tmp_path / "final", get_recipe("scene_count"), OPTIONS, steps=60, batch_size=32,
                           learning_rate=3e-3, seed=0, say=said.append)
    assert facts["nearest_words_after"] > facts["nearest_words_before"] + 0.3, facts
    assert said[-1].startswith("align (words): held-out image tokens nearest their own cell's words")
    assert verify(tmp_path / "final") == []
    before = load_model(str(composed), device="cpu", dtype="float32", decide_cache=False).model.state_dict()
    aligned = load_model(str(tmp_path / "final"), device="cpu", dtype="float32", decide_cache=False)
    after = aligned.model.state_dict()
    # saved in bf16, as the training stages save: what did not train is the composed weight rounded to bf16
    moved = {k for k in before if not torch.equal(before[k].to(torch.bfloat16).float(), after[k])}
    assert moved and all("multi_modal_projector" in k for k in moved), sorted(moved)[:5]
    # the saved tokens sit closer to their cells' words than the composed model's
    sample = get_recipe("scene_count").build(split="test", size=1, seed=9, **OPTIONS)[0]
    embeddings = aligned.model.get_input_embeddings().weight
    target = torch.stack([word_vector(embeddings, aligned.processor.tokenizer, n) for n in sample.fields["cell_words"]])
    with torch.no_grad():
        now = image_tokens(aligned, sample.images)[0]
        was = image_tokens(load_model(str(composed), device="cpu", dtype="float32", decide_cache=False), sample.images)[0]
    assert (now - target).norm() < 0.5 * (was - target).norm()


def test_a_recipe_without_cell_words_is_refused(composed, tmp_path):
    with pytest.raises(ValueError, match="cell_words"):
        align_to_words(composed, tmp_path / "final", get_recipe("shapes"), {}, steps=1, batch_size=2,
                       learning_rate=1e-3, seed=0)
