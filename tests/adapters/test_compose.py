"""compose(): tiny donors on disk -> a hybrid checkpoint that loads, keeps the donors' weights and sees."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch
from PIL import Image
from transformers import (
    AutoModelForCausalLM,
    CLIPImageProcessor,
    CLIPVisionConfig,
    CLIPVisionModel,
    Qwen2_5_VLForConditionalGeneration,
    SiglipImageProcessor,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from vlm_grpo.adapters.assembly import UnsupportedPairing
from vlm_grpo.adapters.chat_templates import chatml_default_system, chatml_template
from vlm_grpo.compose import compose
from vlm_grpo.adapters.families.hybrid import HybridAdapter
from vlm_grpo.adapters.families.hybrid_llava import LlavaHybridAdapter, assemble_llava
from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.twins.hybrid_llava import TINY_LM, TINY_SIGLIP
from vlm_grpo.adapters.twins.qwen2_5_vl import qwen2_lm
from vlm_grpo.loader import load_model
from vlm_grpo.adapters.seeding import seeded
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

torch.set_num_threads(1)

def tiny_qwen2_lm(seed: int, tie: bool):
    return qwen2_lm(dict(TINY_LM, tie_word_embeddings=tie), seed)


PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red circles?"}]}]


@pytest.fixture(scope="module")
def donors(tmp_path_factory):
    root = tmp_path_factory.mktemp("donors")
    Qwen2_5_VLAdapter.tiny(seed=3).save(root / "qwen_vl")
    lm, tokenizer = tiny_qwen2_lm(seed=4, tie=True)  # tied, like Qwen2.5-0.5B
    lm.save_pretrained(root / "lm")
    tokenizer.save_pretrained(root / "lm")
    lm.to(torch.bfloat16).save_pretrained(root / "lm_bf16")
    tokenizer.save_pretrained(root / "lm_bf16")
    # An LM whose tokenizer lacks Qwen's vision tokens: compose must add them.
    bare = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template="{{ messages }}",
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    lm_bare, _ = tiny_qwen2_lm(seed=5, tie=False)
    lm_bare.resize_token_embeddings(len(bare))
    lm_bare.save_pretrained(root / "lm_bare")
    bare.save_pretrained(root / "lm_bare")
    # A hub-style tokenizer: right padding by default, nothing about padding in its saved config (as SmolLM2's).
    right = tiny_qwen2_lm(seed=4, tie=True)[1]
    right.init_kwargs.pop("padding_side", None)
    right.padding_side = "right"
    lm.save_pretrained(root / "lm_right")
    right.save_pretrained(root / "lm_right")
    with seeded(6):
        SiglipVisionModel(SiglipVisionConfig(**TINY_SIGLIP)).save_pretrained(root / "siglip")  # no image processor
        clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=56, patch_size=14))
    clip.save_pretrained(root / "clip")
    CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}).save_pretrained(root / "clip")
    return root


def _text_logit_diff(adapter, lm_dir) -> float:
    lm = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    ids = adapter.tokenizer("There are 3 red circles. The answer is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ours = adapter.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        ref = lm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return (ours[..., : ref.shape[-1]] - ref).abs().max().item()


def _generates(adapter) -> None:
    batch = adapter.encode_prompts([PROMPT], [[Image.new("RGB", (70, 50), "red")]])
    assert batch.images_per_sample == [1]
    out = adapter.generate(batch, max_new_tokens=3, min_new_tokens=3)
    assert out.sequences.shape[1] == batch.input_ids.shape[1] + 3


@pytest.mark.parametrize("lm_name", ["lm", "lm_bare"])
def test_qwen_pairing(donors, tmp_path, lm_name):
    out = compose(str(donors / "qwen_vl"), str(donors / lm_name), str(tmp_path / "hybrid"), seed=0)
    adapter = HybridAdapter.load(str(out))
    assert type(adapter) is HybridAdapter
    assert _text_logit_diff(adapter, donors / lm_name) <= 1e-5
    for token in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"):
        assert len(adapter.tokenizer.encode(token, add_special_tokens=False)) == 1

    donor = Qwen2_5_VLForConditionalGeneration.from_pretrained(donors / "qwen_vl").model.visual.state_dict()
    ours = adapter.model.model.visual.state_dict()
    for name, weight in donor.items():
        if not name.startswith("merger.mlp.2."):
            assert torch.equal(ours[name], weight), name
    assert ours["merger.mlp.2.weight"].shape == (48, donor["merger.mlp.2.weight"].shape[1])
    _generates(adapter)
    assert type(load_model(f"hybrid:{out}")) is HybridAdapter


@pytest.mark.parametrize("vision_name", ["siglip", "clip"])
def test_llava_pairing(donors, tmp_path, vision_name):
    out = compose(str(donors / vision_name), str(donors / "lm"), str(tmp_path / "hybrid"), seed=0)
    adapter = HybridAdapter.load(str(out))
    assert type(adapter) is LlavaHybridAdapter
    assert type(load_model(str(out))) is LlavaHybridAdapter  # bare path: model_type llava
    assert _text_logit_diff(adapter, donors / "lm") <= 1e-5

    cls = SiglipVisionModel if vision_name == "siglip" else CLIPVisionModel
    donor = cls.from_pretrained(donors / vision_name).state_dict()
    ours = adapter.model.model.vision_tower.state_dict()
    assert set(ours) == {k for k in donor if not k.startswith("head.")}
    assert all(torch.equal(ours[k], donor[k]) for k in ours)
    assert adapter.model.model.multi_modal_projector.linear_2.out_features == 48
    _generates(adapter)


@pytest.mark.parametrize("vision_name", ["qwen_vl", "siglip"])
def test_hybrid_takes_the_lm_dtype(donors, tmp_path, vision_name):
    out = compose(str(donors / vision_name), str(donors / "lm_bf16"), str(tmp_path / "hybrid"))
    adapter = HybridAdapter.load(str(out))
    assert {p.dtype for p in adapter.model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("cls", [HybridAdapter, LlavaHybridAdapter])
def test_tiny_save_reload(cls, tmp_path):
    adapter = cls.tiny()
    adapter.save(tmp_path)
    again = HybridAdapter.load(str(tmp_path))
    assert type(again) is cls
    batch = adapter.encode_prompts([PROMPT], [[Image.new("RGB", (40, 60), "green")]])
    with torch.no_grad():
        before = adapter.model(**batch.model_inputs()).logits
        after = again.model(**again.encode_prompts([PROMPT], [[Image.new("RGB", (40, 60), "green")]]).model_inputs()).logits
    assert torch.equal(before, after)


def test_llava_siglip_trains_every_vision_parameter(donors, tmp_path):
    out = compose(str(donors / "siglip"), str(donors / "lm"), str(tmp_path / "hybrid"))
    adapter = LlavaHybridAdapter.load(str(out))
    batch = adapter.encode_prompts([PROMPT], [[Image.new("RGB", (40, 40), "blue")]])
    adapter.model(**batch.model_inputs()).logits.float().square().mean().backward()
    idle = [n for n, p in adapter.model.named_parameters() if p.grad is None or not p.grad.any()]
    assert idle == []


def test_tampered_prompt_is_caught():
    adapter = LlavaHybridAdapter.tiny()
    batch = adapter.encode_prompts([PROMPT], [[Image.new("RGB", (40, 40), "blue")]])
    batch.input_ids[0, batch.image_spans[0][0][0]] = adapter.tokenizer.pad_token_id
    with pytest.raises(ValueError, match="sample 0"):
        adapter.check_alignment(batch)


def test_unsupported_pairing_names_the_supported_ones(donors, tmp_path):
    with pytest.raises(UnsupportedPairing, match="Supported"):
        compose(str(donors / "lm"), str(donors / "lm"), str(tmp_path / "x"))
    with pytest.raises(UnsupportedPairing, match="qwen2"):
        compose(str(donors / "qwen_vl"), str(donors / "qwen_vl"), str(tmp_path / "x"))


@pytest.mark.parametrize("cls", [HybridAdapter, LlavaHybridAdapter])
def test_tiny_is_deterministic(cls):
    a, b, c = cls.tiny(seed=0).model.state_dict(), cls.tiny(seed=0).model.state_dict(), cls.tiny(seed=1).model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_preset_builds_on_meta():
    with torch.device("meta"):
        adapter = HybridAdapter.preset("hybrid_3b_vit_0_5b")
    groups = adapter.module_groups()
    params = dict(adapter.model.named_parameters())
    count = {g: sum(params[n].numel() for n in names) for g, names in groups.items()}
    assert 490e6 < count["language"] < 500e6  # Qwen2.5-0.5B, tied head
    assert adapter.model.model.visual.merger.mlp[2].out_features == 896
    assert adapter.model.dtype == torch.bfloat16


def test_vision_donor_is_any_model_value(donors, tmp_path):
    """compose reads its vision donor through the model-spec parser and the loader: a tiny twin works too."""
    out = compose("tiny:qwen2_5_vl", str(donors / "lm"), str(tmp_path / "hybrid"), seed=0)
    adapter = HybridAdapter.load(str(out))
    donor = Qwen2_5_VLAdapter.tiny(seed=0).model.model.visual.state_dict()
    ours = adapter.model.model.visual.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in donor.items() if not k.startswith("merger.mlp.2."))
    assert _text_logit_diff(adapter, donors / "lm") <= 1e-5


# An instruct LM's own ChatML template with a default system turn of its own (as SmolLM2's: "You are a helpful
# AI assistant named SmolLM, trained by Hugging Face"), written here, string content only.
OWN_SYSTEM = "You are Tiny, a test model."
OWN_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + OWN_SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _llava_with_template(template: str):
    tokenizer = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template=template,
        eos_token="<|im_end|>", pad_token="<|im_end|>",  # pad == eos, as SmolLM2's
    )
    lm, _ = tiny_qwen2_lm(seed=7, tie=True)
    lm.resize_token_embeddings(len(tokenizer))
    with seeded(8):
        vision = SiglipVisionModel(SiglipVisionConfig(**TINY_SIGLIP))
    size = {"height": TINY_SIGLIP["image_size"], "width": TINY_SIGLIP["image_size"]}
    return assemble_llava(vision, SiglipImageProcessor(size=size), lm, tokenizer), tokenizer


def test_llava_keeps_the_lm_default_system_turn():
    """Regression (SmolLM2): the hybrid's template opened every prompt with a generic system turn instead of
    the one the instruct LM was tuned with; a text-only conversation must render exactly as the LM's own."""
    composed, donor_tokenizer = _llava_with_template(OWN_TEMPLATE)
    text_only = [{"role": "user", "content": "How many red circles?"}]
    ours = composed.processor.apply_chat_template(text_only, add_generation_prompt=True, tokenize=False)
    assert ours == donor_tokenizer.apply_chat_template(text_only, add_generation_prompt=True, tokenize=False)
    with_image = composed.processor.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert with_image.startswith(f"<|im_start|>system\n{OWN_SYSTEM}<|im_end|>\n<|im_start|>user\n<image>How many")
    own_system = [{"role": "system", "content": "Be brief."}, *text_only]
    assert OWN_SYSTEM not in composed.processor.apply_chat_template(own_system, tokenize=False)


def test_llava_with_a_non_chatml_lm_template_says_so():
    composed, _ = _llava_with_template("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert any("not ChatML" in note for note in composed.notes)
    text = composed.processor.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_chatml_default_system_reads_a_template_without_one():
    tokenizer = build_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template=chatml_template("<image>", default_system=None),
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    assert chatml_default_system(tokenizer) is None
    tokenizer.chat_template = OWN_TEMPLATE
    assert chatml_default_system(tokenizer) == OWN_SYSTEM


@pytest.mark.parametrize("vision_name", ["qwen_vl", "siglip"])
def test_composed_checkpoint_pads_left_wherever_it_loads(donors, tmp_path, vision_name):
    """Regression (SmolLM2's real tokenizer): compose set left padding on the tokenizer but the saved config did
    not say so, and a plain AutoProcessor load of the hybrid padded right."""
    from transformers import AutoProcessor, AutoTokenizer

    assert AutoTokenizer.from_pretrained(donors / "lm_right").padding_side == "right"
    out = compose(str(donors / vision_name), str(donors / "lm_right"), str(tmp_path / "hybrid"))
    assert AutoProcessor.from_pretrained(out).tokenizer.padding_side == "left"


def test_compose_into_a_folder_of_the_users_files_moves_them_aside_and_replaces_its_own(donors, tmp_path, capsys):
    """`vlm-grpo compose --out` (and `convert-gguf --out`, the same saved_folder) never writes over a user's files:
    the folder is moved aside whole, named in the message; composing there again replaces the earlier composition."""
    from vlm_grpo.cli import main

    out = tmp_path / "hybrid"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n')
    command = ["compose", "--vision", str(donors / "siglip"), "--llm", str(donors / "lm"), "--out", str(out)]
    assert main(command) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("hybrid.replaced-")]
    assert len(aside) == 1 and (aside[0] / "config.json").read_text() == '{"mine": true}\n'
    assert f"moved it to {aside[0]}" in capsys.readouterr().out
    assert main(command) == 0  # its own earlier output: replaced
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("hybrid.replaced-")] == [aside[0].name]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-save-")]
    assert type(load_model(str(out))) is LlavaHybridAdapter
