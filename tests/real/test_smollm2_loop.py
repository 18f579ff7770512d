"""The composed SmolLM2 hybrid through the CLI: the cache probe, GRPO with LoRA and eval, each saving or reading a
checkpoint that reloads (SFT on the real model under the freeze preset, and its reload: test_experiment_pipeline.py).
Small settings keep the group fast on 2 CPU cores."""

from __future__ import annotations

import json
import shutil

import torch

from tests.real.marks import REAL
from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.loader import load_model

pytestmark = REAL

IM_END = 2
SMALL = ["--recipe", "shapes", "--train-size", "8", "--batch-size", "2", "--num-generations", "2",
         "--max-new-tokens", "12", "--logging.progress", "false"]


def _generates(adapter) -> None:
    from PIL import Image

    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many circles?"}]}]
    batch = adapter.encode_prompts([prompt], [[Image.new("RGB", (64, 64), "white")]])
    out = adapter.generate(batch, max_new_tokens=4, min_new_tokens=4)
    assert out.sequences.shape[1] == batch.input_ids.shape[1] + 4


def test_preflight_check_passes(hybrid_dir, capsys):
    """`vlm-grpo check` on the real hybrid: its cache probe (the table `check-cache` prints) agrees on both paths
    and the image changes the logits, and every other check passes."""
    assert main(["check", "--model", f"hybrid:{hybrid_dir}", "--recipe", "shapes", "--max-new-tokens", "12",
                 "--data.recipe_options", "{image_size: 64}"]) == 0
    out = capsys.readouterr().out
    assert "hybrid_llava" in out and "image changes logits" in out and out.count("agrees") == 2
    assert "5 of 5 checks passed" in out and "FAIL" not in out and "<image>" in out


def test_grpo_with_lora_saves_a_final_that_reloads_and_evaluates(hybrid_dir, hybrid, tmp_path):
    out = tmp_path / "grpo"
    args = ["train", "--model", f"hybrid:{hybrid_dir}", "--lora.r", "8", "--max-steps", "2", "--output-dir", str(out)]
    assert main([*args, *SMALL]) == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    completions = read_jsonl(out / "completions.jsonl")
    assert len(completions) == 2 * 2 * 2  # steps x prompts x generations
    assert not any("<image>" in c["completion"] or "<|im_end|>" in c["completion"] for c in completions)
    assert (out / "final" / "adapter_model.safetensors").is_file()

    merged = load_model(str(out / "final" / "merged"), device="cpu", decide_cache=False)
    assert type(merged).__name__ == "LlavaHybridAdapter"
    assert len(merged.tokenizer) == len(hybrid.tokenizer) and merged.eos_token_ids == [IM_END]
    embed = merged.model.get_input_embeddings().weight
    assert merged.model.lm_head.weight.data_ptr() == embed.data_ptr()  # still tied after the merge
    before, after = hybrid.model.state_dict(), merged.model.state_dict()
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(before[q], after[q])  # the LoRA deltas were merged in
    vision = [k for k in before if k.startswith("model.vision_tower.")]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)  # LoRA adapts the LM only
    _generates(merged)

    assert main(["eval", "--model", str(out / "final"), "--recipe", "shapes", "--size", "2",
                 "--max-new-tokens", "12", "--output-dir", str(out)]) == 0
    report = json.loads((out / "eval-test.json").read_text())
    assert report["size"] == 2 and len(report["samples"]) == 2 and 0.0 <= report["accuracy"] <= 1.0
    shutil.rmtree(out)  # 1.5 GB; a failing run's directory stays for a look
