"""A VLM GRPO script shaped like TRL's examples/scripts/grpo_vlm.py (system message, image column, trl.rewards'
think_format_reward and accuracy_reward, a LoraConfig, an eval split, per_device_train_batch_size, save_strategy,
report_to="none", model_init_kwargs, logging_steps) runs with only its import changed."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("trl")

SCRIPT = Path(__file__).with_name("trl_vlm_script.py")


def test_the_script_differs_from_trls_by_its_import_only():
    lines = SCRIPT.read_text().splitlines()
    ours = [line for line in lines if "vlm_grpo" in line]
    assert ours == ["from vlm_grpo import GRPOConfig, GRPOTrainer  # the only change: TRL's script has "
                    "`from trl import ...`"]


def test_the_trl_shaped_vlm_script_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    out = tmp_path / "grpo-vlm"
    done = runpy.run_path(str(SCRIPT), init_globals={"MODEL": "tiny:smolvlm", "OUTPUT_DIR": str(out)})
    trainer, args = done["trainer"], done["training_args"]
    cfg = trainer.cfg
    # TRL's meaning: 4 completions per device = 2 prompts x 2 generations; LoRA r=8 on q/v; fp32 eager model
    assert (cfg.data.batch_size, cfg.data.num_generations, cfg.lora.r, cfg.lora.target_modules) == (2, 2, 8, ["q_proj", "v_proj"])
    assert (cfg.model.dtype, cfg.model.attn_implementation, cfg.logging.report_to) == ("float32", "eager", [])
    history = trainer.state.log_history
    assert [e["step"] for e in history if "loss" in e] == [1, 2]  # logging_steps=1
    assert [e["step"] for e in history if "eval_accuracy" in e or any(k.startswith("eval_") for k in e)] == [2]
    assert {"rewards/think_format_reward", "rewards/accuracy_reward"} <= set(history[0])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # save_steps=1
    assert (out / "adapter_model.safetensors").is_file()  # save_model(output_dir): the LoRA adapter, as TRL saves it
    assert args.per_device_train_batch_size == 4 and args.logging_steps == 1  # read back as written
