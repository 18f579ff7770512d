"""SmolLM2-135M-Instruct (a real pretrained LM, its 49k-token tokenizer and chat template) composed with a small
random SigLIP tower in the LLaVA classes: the composition keeps the LM, and the adapter handles its real tokens.

Only the LLaVA pairing is tested: the Qwen pairing (a Qwen2.5-VL ViT inside the Qwen2.5-VL classes) takes a Qwen2
LM only. Its text model is Qwen2's (q/k/v projections with biases, Qwen2 config keys), and a Llama LM such as
SmolLM2 is refused with an error before any weights load (`test_qwen_pairing_refuses_a_llama_lm`).
"""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tests.real.marks import REAL
from vlm_grpo.adapters.assembly import UnsupportedPairing
from vlm_grpo.compose import compose
from vlm_grpo.grpo.sft import reference_token_ids
from vlm_grpo.recipes import get_recipe

pytestmark = REAL

DONOR_VOCAB = 49152
IM_START, IM_END = 1, 2  # SmolLM2's own ids; pad is <|im_end|> too
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IMAGE_PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red circles are there?"}]}]
CAPITAL = "What is the capital of France? Answer in one word."


def text_prompt(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def test_converted_checkpoint_is_an_ordinary_llama(smollm2_dir, donor):
    lm, tokenizer = donor
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert type(lm).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in lm.parameters()) == 134_515_008
    assert len(tokenizer) == DONOR_VOCAB
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == IM_END


def test_text_only_logits_equal_the_donor(hybrid, donor):
    lm, lm_tokenizer = donor
    conversation = [{"role": "user", "content": CAPITAL}]
    text = lm_tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    ids = lm_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert torch.equal(hybrid.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"], ids)
    with torch.no_grad():
        ours = hybrid.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        ref = lm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert ours.shape[-1] == DONOR_VOCAB + 1
    assert (ours[..., :DONOR_VOCAB] - ref).abs().max().item() <= 1e-4

    # the same prompt through the adapter: the hybrid's template writes what the LM's own writes, and a
    # left-padded row (pad == eos == <|im_end|>, masked) ends with the donor's next-token logits
    batch = hybrid.encode_prompts([text_prompt(CAPITAL), text_prompt("Name the three primary colours of light, and say in one sentence why a screen needs only these three.")], [[], []])
    assert batch.input_ids.shape[1] > ids.shape[1] and torch.equal(batch.input_ids[0, -ids.shape[1]:], ids[0])
    assert batch.attention_mask[0, 0] == 0 and batch.input_ids[0, 0] == IM_END
    with torch.no_grad():
        padded = hybrid.model(**hybrid.model_inputs(batch)).logits[0, -1, :DONOR_VOCAB]
    assert (padded - ref[0, -1]).abs().max().item() <= 1e-3


def test_the_image_token_was_added_once_and_the_embeddings_grew(hybrid, donor, hybrid_dir):
    from transformers import AutoProcessor

    lm, _ = donor
    tokenizer = hybrid.tokenizer
    assert hybrid.image_token_id == DONOR_VOCAB == tokenizer.convert_tokens_to_ids("<image>")
    assert len(tokenizer) == DONOR_VOCAB + 1  # <image> only: the ChatML tokens were already there
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
    assert tokenizer.encode("<image><image>", add_special_tokens=False) == [DONOR_VOCAB] * 2
    reloaded = AutoProcessor.from_pretrained(hybrid_dir).tokenizer  # as TRL or a user would load it
    assert len(reloaded) == DONOR_VOCAB + 1  # not re-added on reload
    assert reloaded.padding_side == "left"  # SmolLM2's tokenizer pads right; the hybrid's saved config says left

    embed = hybrid.model.get_input_embeddings().weight
    assert embed.shape[0] == hybrid.model.config.text_config.vocab_size == DONOR_VOCAB + 1
    assert hybrid.model.lm_head.weight.data_ptr() == embed.data_ptr()  # tied, as SmolLM2's head is
    donor_embed = lm.get_input_embeddings().weight
    assert torch.equal(embed[:DONOR_VOCAB], donor_embed)
    assert torch.allclose(embed[DONOR_VOCAB], donor_embed.mean(dim=0), atol=1e-6)
    assert hybrid.model.dtype == torch.float32  # the GGUF is dequantised to float32


def test_chat_template_renders_the_placeholder_and_tokens_match_features(hybrid):
    text = hybrid.processor.apply_chat_template(IMAGE_PROMPT, add_generation_prompt=True, tokenize=False)
    assert text == (f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\n<image>How many red circles "
                    "are there?<|im_end|>\n<|im_start|>assistant\n")
    images = [[Image.new("RGB", (90, 60), "red")], []]
    batch = hybrid.encode_prompts([IMAGE_PROMPT, text_prompt(CAPITAL)], images)
    per_row = (batch.input_ids == hybrid.image_token_id).sum(dim=1).tolist()
    assert per_row == hybrid.feature_counts(batch) == [16, 0]  # (64 / 16)^2 patches, SigLIP keeps them all
    (start, end), = batch.image_spans[0]
    assert end - start == 16 and batch.image_spans[1] == []
    with torch.no_grad():
        red = hybrid.model(**hybrid.model_inputs(batch)).logits  # LLaVA itself checks tokens against features
        batch.mm["pixel_values"] = torch.flip(batch.mm["pixel_values"], dims=[-1, -3])
        other = hybrid.model(**hybrid.model_inputs(batch)).logits
    assert (red[0, -1] - other[0, -1]).abs().max() > 1e-3  # the image reaches the LM
    assert torch.equal(red[1, -1], other[1, -1])  # ... of its own row only


def test_generation_stops_at_the_real_im_end(hybrid):
    assert hybrid.eos_token_ids == [IM_END]
    batch = hybrid.encode_prompts([text_prompt(CAPITAL)], [[]])
    out = hybrid.generate(batch, max_new_tokens=32)
    completion = out.sequences[0, batch.input_ids.shape[1]:].tolist()
    assert IM_END in completion and completion.index(IM_END) < 31, completion  # stopped, not cut
    answer = hybrid.tokenizer.decode(completion[: completion.index(IM_END)])
    assert "Paris" in answer  # the pretrained LM is intact: random weights do not know this


def test_suppressed_ids_include_the_added_image_token(hybrid):
    assert hybrid.image_token_id in hybrid.suppressed_token_ids()
    batch = hybrid.encode_prompts([IMAGE_PROMPT], [[Image.new("RGB", (64, 64), "blue")]])
    settings = hybrid.generation_kwargs(max_new_tokens=2)
    with torch.no_grad():
        out = hybrid.model.generate(**hybrid.model_inputs(batch), **settings, output_scores=True)
    for step in out.scores:  # the processed scores: the placeholder can never be drawn
        assert step[0, hybrid.image_token_id] == float("-inf")
        assert torch.isfinite(step[0, :DONOR_VOCAB]).any()


def test_sft_references_end_with_the_real_im_end(hybrid):
    sample = get_recipe("shapes").build(split="train", size=1, seed=0, image_size=64)[0]
    ids = reference_token_ids(hybrid, sample)
    assert ids[-1] == IM_END and IM_END not in ids[:-1]
    assert hybrid.tokenizer.decode(ids[:-1]).strip() == sample.reference.strip()


def test_qwen_pairing_refuses_a_llama_lm(gguf_path, tmp_path):
    with pytest.raises(UnsupportedPairing, match=r"pairs only with a Qwen2 LM .*got 'llama'"):
        compose("tiny:qwen2_5_vl", str(gguf_path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
