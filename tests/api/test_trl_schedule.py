"""The same GRPOConfig given to TRL's GRPOTrainer (a tiny random text model: TRL is the oracle) and to ours (the tiny
SmolVLM twin): the same prompts and completions per generation, optimizer steps, logged steps, evaluated steps and
checkpoint steps. The settings are TRL's own: completions per device and micro-step, epochs with max_steps=-1,
logging_steps with logging_first_step, save_steps, eval_strategy="steps" with eval_steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback  # noqa: E402

from tests.recipes.helpers import image  # noqa: E402

COMMON = dict(num_generations=2, max_completion_length=3, per_device_eval_batch_size=2, report_to="none", seed=0)
CONFIGS = {
    # 6 rows, 2 prompts per generation: 3 optimizer steps in one epoch
    "steps": (6, dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1, max_steps=-1,
                      logging_steps=2, logging_first_step=True, save_steps=2, eval_strategy="steps", eval_steps=2)),
    # 4 rows, 2 prompts per generation, 1.5 epochs: 3 steps, passes ending at steps 2 and 3
    "epoch": (4, dict(per_device_train_batch_size=4, num_train_epochs=1.5, logging_strategy="epoch",
                      eval_strategy="epoch", eval_on_start=True, save_strategy="no")),
}


class Recorder(TrainerCallback):
    """What each trainer did and when: evaluations, saves, and whether a reward call is a training generation."""

    def __init__(self):
        self.evaluated, self.saved, self.phase, self.calls = [], [], "start", []

    def on_step_begin(self, args, state, control, **kwargs):
        self.phase = "train"

    def on_step_end(self, args, state, control, **kwargs):
        self.phase = "after"

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluated.append(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.saved.append(state.global_step)

    def reward(self, prompts, completions, **kwargs):
        self.calls.append((self.phase, len(completions), len({str(p) for p in prompts})))
        return [float(i % 2) for i in range(len(completions))]


def summary(trainer, recorder: Recorder, out: Path, train_calls) -> dict:
    history = trainer.state.log_history
    return {
        "generations": train_calls,  # (completions, distinct prompts) of each training generation
        "optimizer_steps": trainer.state.global_step,
        "logged_train_steps": [e["step"] for e in history if "loss" in e],
        "logged_eval_steps": [e["step"] for e in history if any(k.startswith("eval_") for k in e)],
        "last_log": (history[-1]["step"], "train_runtime" in history[-1]),
        "evaluated": recorder.evaluated,
        "saved": recorder.saved,
        "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
    }


def run_trl(out: Path, rows: int, settings: dict) -> dict:
    from vlm_grpo.loader import load_model

    tokenizer = load_model("tiny:smolvlm").tokenizer
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    rows = [{"prompt": f"Which colour is square {i}?"} for i in range(rows)]
    recorder = Recorder()
    args = trl.GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, gradient_checkpointing=False, **COMMON,
                          **settings)
    trainer = trl.GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=recorder.reward, args=args,
                              train_dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[:2]),
                              callbacks=[recorder])
    trainer.train()
    return summary(trainer, recorder, out, [c[1:] for c in recorder.calls if c[0] == "train"])


def run_ours(out: Path, rows: int, settings: dict) -> dict:
    from vlm_grpo import GRPOConfig, GRPOTrainer

    rows = [{"prompt": f"Which colour is square {i}?", "image": image(i)} for i in range(rows)]
    recorder = Recorder()
    args = GRPOConfig(output_dir=str(out), progress=False, **COMMON, **settings)
    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=recorder.reward, args=args,
                          train_dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[:2]),
                          callbacks=[recorder])
    evaluate = trainer.evaluate

    def evaluating(*a, **k):  # our step hook runs after the step: evaluation calls are told apart here
        recorder.phase = "eval"
        try:
            return evaluate(*a, **k)
        finally:
            recorder.phase = "train"

    trainer.evaluate = evaluating
    recorder.phase = "train"
    # here on_step_begin and on_step_end both come after the step: the phase is kept by `evaluating` alone
    recorder.on_step_begin = recorder.on_step_end = lambda *a, **k: None
    trainer.train()
    return summary(trainer, recorder, out, [c[1:] for c in recorder.calls if c[0] == "train"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_same_config_runs_the_same_schedule_as_trl(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rows, settings = CONFIGS[name]
    theirs = run_trl(tmp_path / "trl", rows, settings)
    ours = run_ours(tmp_path / "ours", rows, settings)
    assert theirs["generations"] == [(4, 2)] * 3 and theirs["optimizer_steps"] == 3  # the oracle did as set
    assert ours == theirs
