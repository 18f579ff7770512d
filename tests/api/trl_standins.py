"""Offline stand-ins for the tiny hub models and datasets TRL's GRPO tests load (`trl-internal-testing/...`).

`build(root, names)` writes each named model or dataset as a local folder under `root/trl-internal-testing/NAME`;
a script run from `root` then loads it by the same id it would give the hub (transformers and datasets read a
local folder of that relative path first). Models are random and tiny (2 layers, width 32-64) with a tokenizer
trained here that carries the family's special tokens and a chat template; VLMs are this project's tiny twins.
Datasets are made of short prompts written here, in TRL's formats (standard and conversational, prompt-only;
with one image or two).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ORG = "trl-internal-testing"

# a few dozen short prompts of our own: 17 train rows and 2 test rows per config, as TRL's zen set has
PROMPTS = [
    "Small steps make long roads.", "A clear name saves a comment.", "Measure before you cut.",
    "Errors should be loud.", "Simple beats clever.", "Tests tell the truth.", "Read the code twice.",
    "One job per function.", "Flat is easier to scan.", "Names carry meaning.", "Write it down.",
    "Fix the cause, not the symptom.", "Prefer plain words.", "Keep the loop short.", "Check the input.",
    "Leave the place tidy.", "Ask why twice.", "Ship small changes.", "Sleep on big ones.",
]
TRAIN, TEST = PROMPTS[:17], PROMPTS[17:]

TEXT_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048)

# text model ids -> (transformers config class, model class, extra config)
TEXT_MODELS = {
    "tiny-Qwen2ForCausalLM-2.5": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": ("Qwen2Config", "Qwen2ForSequenceClassification", {"num_labels": 1}),
    "tiny-Qwen3ForCausalLM": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "tiny-Qwen3ForSequenceClassification": ("Qwen3Config", "Qwen3ForSequenceClassification",
                                            {"head_dim": 8, "num_labels": 1}),
    "tiny-LlamaForCausalLM-3.2": ("LlamaConfig", "LlamaForCausalLM", {}),
    "tiny-LlamaForSequenceClassification-3.2": ("LlamaConfig", "LlamaForSequenceClassification", {"num_labels": 1}),
    "tiny-MistralForCausalLM-0.2": ("MistralConfig", "MistralForCausalLM", {}),
    "tiny-Gemma2ForCausalLM": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8}),
    "tiny-Cohere2ForCausalLM": ("Cohere2Config", "Cohere2ForCausalLM", {}),
    "tiny-Glm4MoeForCausalLM": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                                {"head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                                 "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 1,
                                 "topk_group": 1}),
    "tiny-GptOssForCausalLM": ("GptOssConfig", "GptOssForCausalLM",
                               {"head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                                "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}),
    "tiny-NemotronHForCausalLM-nano": ("NemotronHConfig", "NemotronHForCausalLM",
                                       {"head_dim": 8, "hybrid_override_pattern": "M*", "mamba_num_heads": 4,
                                        "mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 1,
                                        "num_hidden_layers": 2}),
    "tiny-Qwen3MoeForCausalLM": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                                 {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                  "output_router_logits": True}),
}
# VLM ids -> this project's tiny twin that stands in for them
VLM_MODELS = {
    "tiny-Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "tiny-Gemma3ForConditionalGeneration": "gemma3",
    "tiny-Gemma4ForConditionalGeneration": "gemma4",
    "tiny-Qwen3_5ForConditionalGeneration-NoThink": "qwen3_5",
    "tiny-Qwen3_5MoeForConditionalGeneration-3.6": "qwen3_5_moe",
    "tiny-SmolVLMForConditionalGeneration": "smolvlm",
    "tiny-LlavaForConditionalGeneration": "hybrid_llava",
    "tiny-LlavaNextForConditionalGeneration": "llava_next",
    "tiny-Qwen2VLForConditionalGeneration": "qwen2_vl",
}
DATASETS = ("zen", "zen-image", "zen-multi-image")
REMOTE = "tiny-RemoteForCausalLM"  # a model whose own code (config.json's auto_map) defines its classes
REMOTE_CODE = """from transformers import Qwen2Config, Qwen2ForCausalLM


class RemoteConfig(Qwen2Config):
    model_type = "remote"


class RemoteForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteConfig
"""


def text_tokenizer():
    from vlm_grpo.adapters.twins.causal_lm import CHATML_TEXT
    from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

    return build_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template=CHATML_TEXT,
                           eos_token="<|im_end|>", pad_token="<|endoftext|>")


def build_text_model(name: str, out: Path, seed: int = 0) -> None:
    import transformers

    config_name, model_name, extra = TEXT_MODELS[name]
    tokenizer = text_tokenizer()
    config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=False, **{**TEXT_SIZES, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_remote(out: Path, seed: int = 0) -> None:
    """A Qwen2 LM saved under a model type of its own whose classes live in the folder's Python file."""
    build_text_model("tiny-Qwen2ForCausalLM-2.5", out, seed)
    (out / "remote_model.py").write_text(REMOTE_CODE)
    config = json.loads((out / "config.json").read_text())
    config.update(model_type="remote", architectures=["RemoteForCausalLM"],
                  auto_map={"AutoConfig": "remote_model.RemoteConfig",
                            "AutoModelForCausalLM": "remote_model.RemoteForCausalLM"})
    (out / "config.json").write_text(json.dumps(config, indent=2))


def build_vlm(name: str, out: Path, seed: int = 0) -> None:
    from vlm_grpo.adapters.registry import adapter_class

    adapter_class(VLM_MODELS[name]).tiny(seed=seed).save(out)


def _image(k: int):
    from PIL import Image

    return Image.new("RGB", (32 + 8 * (k % 3), 32), (20 * k % 256, 200 - 7 * k % 200, 90))


def build_dataset(name: str, out: Path) -> None:
    """TRL's prompt-only configs as JSONL files with a README that names each config's splits."""
    configs = {}
    if name == "zen":
        configs["standard_prompt_only"] = {split: [{"prompt": p} for p in rows] for split, rows in
                                           (("train", TRAIN), ("test", TEST))}
        configs["conversational_prompt_only"] = {split: [{"prompt": [{"role": "user", "content": p}]} for p in rows]
                                                 for split, rows in (("train", TRAIN), ("test", TEST))}
    else:
        from datasets import Dataset, Image

        per_row = 1 if name == "zen-image" else 2
        for split, rows in (("train", TRAIN), ("test", TEST)):
            records = []
            for k, text in enumerate(rows):
                parts = [{"type": "image", "text": None}] * per_row + [{"type": "text", "text": text}]
                record = {"prompt": [{"role": "user", "content": parts}]}
                pictures = [_image(k + j) for j in range(per_row)]
                record.update({"image": pictures[0]} if per_row == 1 else {"images": pictures})
                records.append(record)
            folder = out / "conversational_prompt_only"
            folder.mkdir(parents=True, exist_ok=True)
            ds = Dataset.from_list(records)
            ds = ds.cast_column("image", Image()) if per_row == 1 else ds
            ds.to_parquet(str(folder / f"{split}.parquet"))
        _readme(out, {"conversational_prompt_only": ["train", "test"]}, "parquet")
        return
    for config, splits in configs.items():
        folder = out / config
        folder.mkdir(parents=True, exist_ok=True)
        for split, rows in splits.items():
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _readme(out, {c: list(s) for c, s in configs.items()}, "jsonl")


def _readme(out: Path, configs: dict[str, list[str]], ext: str) -> None:
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {s}\n    path: {config}/{s}.{ext}" for s in splits]
    (out / "README.md").write_text("\n".join(lines + ["---", ""]))


def build(root: Path, names=None) -> Path:
    """Every stand-in (or those `names`) under `root/trl-internal-testing/`; returns `root`."""
    names = names or [*TEXT_MODELS, *VLM_MODELS, REMOTE, *DATASETS]
    for name in names:
        out = Path(root) / ORG / name
        if out.is_dir():
            continue
        if name in TEXT_MODELS:
            build_text_model(name, out)
        elif name == REMOTE:
            build_remote(out)
        elif name in VLM_MODELS:
            build_vlm(name, out)
        else:
            build_dataset(name, out)
    return Path(root)


if __name__ == "__main__":
    import sys

    build(Path(sys.argv[1]), sys.argv[2:] or None)
