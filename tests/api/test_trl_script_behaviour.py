"""What a TRL script sees that TRL's own tests check: text-only models train, one generation feeds several optimizer
steps, rewards are never called before training unless asked, a script run twice into one output_dir loses nothing,
save_strategy="no" writes no model until save_model(), evaluate() reports TRL's sampled eval loss (per dataset of a
mapping), TRL's logged keys and trainer attributes, and the fields TRL 1.16 removed are refused as TRL refuses them.
Runs use the tiny text model (`tiny:causal_lm`) so each takes about a second."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from vlm_grpo import GRPOConfig, GRPOTrainer

TINY = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=4, learning_rate=0.1,
            disable_tqdm=True)


def rows(n: int = 4, **extra) -> Dataset:
    return Dataset.from_list([{"prompt": f"Count to {i}.", **{k: v(i) for k, v in extra.items()}} for i in range(n)])


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_a_text_only_model_trains_every_parameter_with_trls_defaults(tmp_path):
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path), **TINY))
    groups = trainer.adapter.module_groups()
    assert groups["vision"] == [] and groups["projector"] == [] and groups["language"] and groups["head"]
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    out = trainer.train()
    assert out.global_step == 6  # 3 epochs (TRL's default) x 4 rows / 2 prompts per step
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert sorted(changed) == sorted(before)


def test_a_row_with_an_image_is_refused_by_a_text_only_model_naming_the_sample(tmp_path):
    from PIL import Image

    with pytest.raises(ValueError, match=r"sample \d: 1 image\(s\), but causal_lm is a text-only model"):
        trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, args=GRPOConfig(output_dir=str(tmp_path), **TINY),
                              train_dataset=rows(image=lambda i: Image.new("RGB", (8, 8))))
        trainer.train()


def test_one_generation_feeds_steps_per_generation_optimizer_steps(tmp_path):
    calls = []

    def counted(completions, **kwargs):
        calls.append(len(completions))
        return [float(len(c)) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), **{**TINY, "per_device_train_batch_size": 2}, steps_per_generation=2,
                      max_steps=4, logging_steps=1)
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=counted, train_dataset=rows(), args=args)
    assert (trainer.cfg.data.batch_size, trainer.cfg.steps_per_generation) == (2, 2)  # 4 completions, 2 steps
    trainer.train()
    assert calls == [4, 4]  # two generations of 2 prompts x 2 completions for 4 optimizer steps
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logged] == [1, 2, 3, 4]
    # the second step of a generation trains on the other half, against the old log-probs taken when it was sampled
    assert logged[0]["reward"] == logged[1]["reward"] and logged[2]["reward"] == logged[3]["reward"]


def test_rewards_are_not_called_before_training_unless_the_audit_is_asked_for(tmp_path):
    calls = []

    def counted(completions, **kwargs):
        calls.append(len(completions))
        return [0.0] * len(completions)

    GRPOTrainer(model="tiny:causal_lm", reward_funcs=counted, train_dataset=rows(),
                args=GRPOConfig(output_dir=str(tmp_path / "a"), **TINY))
    assert calls == []
    GRPOTrainer(model="tiny:causal_lm", reward_funcs=counted, train_dataset=rows(),
                args=GRPOConfig(output_dir=str(tmp_path / "b"), audit_rewards=True, **TINY))
    assert calls and (tmp_path / "b" / "reward-audit.json").is_file()


def test_a_script_run_twice_into_one_output_dir_keeps_the_first_run_aside(tmp_path, capsys):
    args = dict(output_dir=str(tmp_path), max_steps=2, save_steps=1, **TINY)
    GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(), args=GRPOConfig(**args)).train()
    (tmp_path / "notes.txt").write_text("mine")
    GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(), args=GRPOConfig(**args)).train()
    earlier = sorted(tmp_path.glob("earlier-*"))
    assert len(earlier) == 1 and "moved the earlier run" in capsys.readouterr().out
    assert {"checkpoint-1", "checkpoint-2", "metrics.jsonl"} <= {p.name for p in earlier[0].iterdir()}
    assert (tmp_path / "checkpoint-2").is_dir() and (tmp_path / "notes.txt").read_text() == "mine"


def test_save_strategy_no_writes_no_model_until_save_model(tmp_path):
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path), max_steps=2, save_strategy="no", **TINY))
    trainer.train()
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "final").exists()
    assert not (tmp_path / "completions.jsonl").exists()  # log_completions: TRL's default False
    trainer.save_model(str(tmp_path / "model"))
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_evaluate_reports_trls_sampled_eval_loss_per_dataset(tmp_path):
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path), num_generations_eval=3, **TINY))
    one = trainer.evaluate(eval_dataset=rows(2))
    assert {"eval_loss", "eval_reward", "eval_reward_std", "eval_rewards/length/mean"} <= set(one)
    both = trainer.evaluate(eval_dataset={"a": rows(2), "b": rows(3)})
    assert {"eval_a_loss", "eval_b_loss"} <= set(both)
    assert trainer.cfg.eval.sampled_generations == 3


def test_trls_logged_keys_and_trainer_attributes(tmp_path):
    def logging_reward(completions, log_metric=None, log_extra=None, **kwargs):
        log_metric("custom", 0.5)
        log_extra("head", [c[:2] for c in completions])
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=logging_reward, train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path), max_steps=2, logging_steps=1, **TINY))
    trainer.train()
    entry = trainer.state.log_history[0]
    assert entry["learning_rate"] == pytest.approx(0.1)  # the rate step 1 used (linear decay from 0.1 over 2 steps)
    assert trainer.state.log_history[1]["learning_rate"] == pytest.approx(0.05)
    assert {"rewards/logging_reward/mean", "rewards/logging_reward/std", "num_tokens", "completions/mean_length",
            "completions/clipped_ratio", "custom"} <= set(entry)
    assert list(trainer._logs["extra"]["head"]) and len(trainer._logs["completion"]) == 4
    assert trainer.ref_model is None and trainer.aux_loss_enabled is False and trainer.entropy_coef == 0.0
    stub = object()
    trainer.accelerator = stub  # a plain attribute in TRL: scripts and tests replace it
    assert trainer.accelerator is stub and trainer.ctx.accelerator is not stub


@pytest.mark.parametrize("name", ["warmup_ratio", "overwrite_output_dir"])
def test_fields_trl_removed_are_refused_as_trl_refuses_them(name):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        GRPOConfig(**{name: 0.1})


def test_trls_construction_checks(tmp_path):
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, args=GRPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(model="tiny:causal_lm", train_dataset=rows(), args=GRPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="must match the number of reward functions"):
        GRPOTrainer(model="tiny:causal_lm", reward_funcs=[length, length], reward_processing_classes=object(),
                    train_dataset=rows(), args=GRPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="lm_head"):
        GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(),
                    args=GRPOConfig(output_dir=str(tmp_path), use_liger_kernel=True))
