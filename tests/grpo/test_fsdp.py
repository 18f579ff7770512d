"""FSDP2 full sharding with 2 CPU processes (gloo): the same gradients as 1 process and as DDP, LoRA and SFT under
sharding. A sharded run that saves, dies and resumes exactly with a plain `final/`: test_multi_node.py (on two
machines, resumed on one); a planted sharded checkpoint refused: tests/reliability/test_safe_loading.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vlm_grpo.adapters.registry import family_class
from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("layout_worker.py")
FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
# accelerate's own FSDP options: on CPU accelerate leaves them to the program, which shards with fully_shard
FSDP_LAUNCH = ["--use_fsdp", "--fsdp_version", "2"]
DENSE_REWARD = "lower=tests.grpo.toy_rewards:lowercase_share"
DDP_LAUNCH = ["--multi_gpu"]


def launch(kind: list[str], port: int, *program: str) -> None:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *kind, "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port), *program]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def cli(*args: str) -> list[str]:
    return ["-m", "vlm_grpo.cli", *args]


def test_gradients_match_across_process_layouts(tmp_path):
    """One process with 4 prompts, 2 DDP processes and 2 FSDP processes with 2 each, on the same completions: the
    update's gradients agree to fp32 round-off (<= 1e-5 of each tensor's largest entry + 1e-9), the weights after the
    AdamW step to 1% of the learning rate. The vision tower trains, so the image features are computed with
    gradient outside the model's own forward (the shared-feature path) on every layout."""
    one, ddp, sharded = tmp_path / "one.pt", tmp_path / "ddp.pt", tmp_path / "fsdp.pt"
    done = subprocess.run([sys.executable, str(WORKER), str(one)], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    launch(DDP_LAUNCH, 29531, str(WORKER), str(ddp))
    launch(DDP_LAUNCH, 29532, str(WORKER), str(sharded), "--fsdp", "full_shard")
    base = torch.load(one)
    assert base["world"] == 1 and base["grads"]
    assert any(".visual." in name or "vision" in name for name in base["grads"])  # the encoder has gradients
    for path in (ddp, sharded):
        other = torch.load(path)
        assert other["world"] == 2
        assert other["grads"].keys() == base["grads"].keys(), path.name
        for name, grad in base["grads"].items():
            scale = grad.abs().max().item() or 1.0
            # + 1e-9: a key bias's gradient is zero in exact arithmetic (softmax ignores it) and ~1e-11 here
            assert (other["grads"][name] - grad).abs().max().item() <= 1e-5 * scale + 1e-9, (path.name, name)
        for name, weight in base["weights"].items():
            assert (other["weights"][name] - weight).abs().max().item() <= 1e-2 * 1e-3, (path.name, name)


def test_lora_and_sft_under_sharding(tmp_path):
    """LoRA under FSDP (the reference is the policy with its adapter off) writes the adapter and a merged model;
    the SFT stage shards the same way."""
    lora = tmp_path / "lora"
    launch(FSDP_LAUNCH, 29536, *cli("train", "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--lora.r", "4",
                                   "--beta", "0.04", "--learning-rate", "1e-2", *FAST, "--output-dir", str(lora),
                                   "--data.rewards", DENSE_REWARD))  # a spread in every group: step 1 updates
    assert read_jsonl(lora / "metrics.jsonl")[-1]["kl"] > 0
    assert (lora / "final" / "adapter_model.safetensors").is_file()
    merged = family_class("qwen2_5_vl").model_class.from_pretrained(lora / "final" / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())

    sft = tmp_path / "sft"
    launch(DDP_LAUNCH, 29537, *cli("sft", "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--fsdp", "full_shard",
                                  *FAST, "--output-dir", str(sft)))
    rows = read_jsonl(sft / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 for r in rows)
    assert (sft / "checkpoint-2" / "sharded").is_dir()
    family_class("qwen2_5_vl").model_class.from_pretrained(sft / "final")


@pytest.mark.parametrize("value", ["full_shard", "full_shard auto_wrap", "shard_grad_op"])
def test_fsdp_setting_spellings(value):
    from vlm_grpo.grpo.settings.sources import load_config

    cfg = load_config(overrides=["--fsdp", value])
    assert cfg.fsdp in ("full_shard", "shard_grad_op")


def test_fsdp_needs_processes_and_refuses_4bit(tmp_path):
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.grpo.setting_fields import SettingError

    with pytest.raises(SettingError, match="fsdp"):
        load_config(overrides=["--fsdp", "full_shard", "--lora.r", "4", "--lora.load_in_4bit", "true"])
    code = main(["train", "--model", "tiny:qwen2_5_vl", "--fsdp", "full_shard", *FAST, "--output-dir", str(tmp_path)])
    assert code == 2
    assert not (tmp_path / "checkpoint-3").exists()
