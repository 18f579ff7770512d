"""SFT warm-up: completion-only labels on every family, learning on a tiny set, hand-off to GRPO."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.conftest import tiny_adapter
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.loader import load_model
from vlm_grpo.cli import main
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.sft import IGNORE_INDEX, build_sft_batch, reference_token_ids, sft_loss
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.recipes import get_recipe
from tests.trained import trained

FAST = ["--data.recipe_options", "{image_size: 56}", "--logging.progress", "false"]


def _samples(n: int = 3):
    data = get_recipe("shapes").build(split="train", size=n, seed=0, image_size=56)
    samples = [data[i] for i in range(n)]
    # one reference clearly longer than the others, so the batch has completion padding
    samples[0] = replace(samples[0], reference=samples[0].reference + " Counting again, one by one, the total stays the same.")
    return samples


def test_labels_cover_exactly_the_reference_tokens(family):
    adapter = tiny_adapter(family)
    samples = _samples()
    batch = build_sft_batch(adapter, samples)
    inputs = batch.model_inputs(adapter)
    labels = batch.labels()
    input_ids, attention = inputs["input_ids"], inputs["attention_mask"]
    assert labels.shape == input_ids.shape
    prompt_len = batch.prompts.input_ids.shape[1]
    assert (labels[:, :prompt_len] == IGNORE_INDEX).all()  # prompt (and its left padding)
    assert (labels[input_ids == adapter.image_token_id] == IGNORE_INDEX).all()  # image placeholders
    assert (labels[attention == 0] == IGNORE_INDEX).all()  # every padding position
    assert (batch.completion_mask == 0).any(), "the batch should contain completion padding"
    for row, sample in enumerate(samples):
        kept = labels[row][labels[row] != IGNORE_INDEX].tolist()
        assert kept == reference_token_ids(adapter, sample)  # every reference token, in order, nothing else
        assert kept == input_ids[row][labels[row] != IGNORE_INDEX].tolist()  # labels sit on their own tokens
        assert kept[-1] in adapter.eos_token_ids
        assert adapter.tokenizer.decode(kept, skip_special_tokens=True).strip() == sample.reference
    # the loss is the mean over exactly those positions: the same as a plain shifted cross-entropy with -100s
    with torch.no_grad():
        logits = adapter.model(**inputs, use_cache=False).logits
        plain = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)
        ours = sft_loss(adapter, batch)
    assert torch.allclose(ours, plain, rtol=1e-5, atol=1e-5)


def test_sft_learns_then_grpo_starts_from_it(tmp_path):
    sft_dir = tmp_path / "sft"
    code = main(["sft", "--model", "tiny:qwen2_5_vl", "--recipe", "shapes", "--train-size", "4", "--batch-size", "4",
                 "--max-steps", "20", "--learning-rate", "3e-3", "--freeze", "vision", "--output-dir", str(sft_dir), *FAST])
    assert code == 0
    losses = [m["loss"] for m in read_jsonl(sft_dir / "metrics.jsonl")]
    assert len(losses) == 20
    assert losses[-1] < 0.5 * losses[0], losses
    final = sft_dir / "final"
    saved = load_file(final / "model.safetensors")
    reloaded = load_model(str(final))  # a bare path: the family comes from config.json
    assert reloaded.family == "qwen2_5_vl"
    fresh = family_class("qwen2_5_vl").tiny(seed=0)
    vision = fresh.module_groups()["vision"]
    state = reloaded.model.state_dict()
    assert all(torch.equal(state[n], p) for n, p in fresh.model.named_parameters() if n in vision)  # frozen
    assert any(not torch.equal(state[n], p) for n, p in fresh.model.named_parameters() if n not in vision)

    cfg = load_config(overrides=["--init-from", str(final), "--max-steps", "2", "--max-new-tokens", "8",
                                 "--output-dir", str(tmp_path / "grpo"), *FAST])
    trainer = GRPOTrainer.from_settings(cfg)
    start = trainer.adapter.model.state_dict()
    assert len(saved) and all(torch.equal(start[k], reloaded.model.state_dict()[k]) for k in start)  # SFT weights
    history = trained(trainer)
    assert [m["step"] for m in history] == [1, 2]
    assert (tmp_path / "grpo" / "final" / "model.safetensors").is_file()


def test_lora_sft_hands_its_merged_model_to_train(tmp_path):
    sft_dir = tmp_path / "sft"
    assert main(["sft", "--model", "tiny:smolvlm", "--recipe", "shapes", "--max-steps", "2", "--lora.r", "4",
                 "--output-dir", str(sft_dir), *FAST]) == 0
    assert (sft_dir / "final" / "adapter_model.safetensors").is_file()
    assert main(["train", "--init-from", str(sft_dir / "final"), "--recipe", "shapes", "--max-steps", "2",
                 "--max-new-tokens", "8", "--output-dir", str(tmp_path / "grpo"), *FAST]) == 0
    assert len(read_jsonl(tmp_path / "grpo" / "metrics.jsonl")) == 2


def test_recipe_without_references_is_refused():
    adapter = tiny_adapter("qwen2_5_vl")
    sample = replace(_samples(1)[0], reference=None)
    with pytest.raises(ValueError, match="reference"):
        build_sft_batch(adapter, [sample])
