"""A TRL script that leaves every GRPOConfig field unset runs TRL's plan here: the same number of optimizer steps,
the same prompts in each step (TRL's RepeatSampler order, seeds 0 and 1) and the same learning rate at each step.

TRL is the oracle: its trainer runs its own loop with the training step replaced by a recorder (the plan does not
depend on what a step computes); ours is read from the built trainer (its steps, its data order, its schedule)."""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402

from vlm_grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from vlm_grpo.loader import load_model  # noqa: E402

PROMPTS = [f"Say something about the number {i}." for i in range(17)]  # 17 rows: 3 epochs of 1-prompt steps = 51


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def trl_plan(tmp_path, seed: int, **fields) -> dict:
    adapter = load_model("tiny:causal_lm", decide_cache=False)
    seen: list[tuple[int, list[str], float]] = []

    class Recording(trl.GRPOTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):  # the plan only: no generation, no update
            seen.append((self.state.global_step + 1, [row["prompt"] for row in inputs], self._get_learning_rate()))
            return torch.zeros(())

    # use_cpu: TRL refuses its own default (bf16) on a CPU without it; it changes no step, prompt or rate
    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), seed=seed, use_cpu=True, **fields)
    trainer = Recording(model=adapter.model, processing_class=adapter.tokenizer, reward_funcs=zero, args=args,
                        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    trainer.train()
    steps = sorted({s for s, _, _ in seen})
    return {"steps": len(steps),
            "prompts": [sorted({p for s, ps, _ in seen if s == step for p in ps}) for step in steps],
            "lr": [next(lr for s, _, lr in seen if s == step) for step in steps]}


def our_plan(tmp_path, seed: int, **fields) -> dict:
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=zero, args=GRPOConfig(output_dir=str(tmp_path / "ours"),
                          seed=seed, **fields), train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]))
    cfg, lrs = trainer.cfg, []
    for _ in range(cfg.max_steps):  # the schedule as the run steps it (one scheduler step per optimizer update)
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.lr_scheduler.step()
    k = cfg.steps_per_generation  # a generation's prompts feed k optimizer steps
    prompts = [sorted({trainer.data.dataset[i].data_prompt for i in trainer.data.batch(s // k).rows})
               for s in range(cfg.max_steps)]
    return {"steps": cfg.max_steps, "prompts": prompts, "lr": lrs, "completions": cfg.data.num_generations,
            "prompts_per_step": cfg.data.batch_size}


@pytest.mark.parametrize("seed", [0, 1])
def test_unset_fields_train_trls_steps_prompts_and_learning_rates(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    theirs, ours = trl_plan(tmp_path, seed), our_plan(tmp_path, seed)
    assert theirs["steps"] == 51 and ours["steps"] == 51  # 3 epochs x 17 prompts, 8 completions of one prompt each
    assert (ours["completions"], ours["prompts_per_step"]) == (8, 1)
    assert ours["prompts"] == theirs["prompts"]
    assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12)
    assert theirs["lr"][0] == pytest.approx(1e-6) and theirs["lr"][-1] < theirs["lr"][0]  # TRL: 1e-6, linear decay


def test_the_order_changes_with_the_seed_as_trls(tmp_path):
    first, second = our_plan(tmp_path / "a", 0), our_plan(tmp_path / "b", 1)
    assert first["prompts"] != second["prompts"]
    assert sorted(p for step in first["prompts"][:17] for p in step) == sorted(PROMPTS)  # a pass sees every row once


def test_a_generation_spread_over_optimizer_steps_follows_trls_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    fields = dict(per_device_train_batch_size=2, num_generations=2, steps_per_generation=2)
    theirs, ours = trl_plan(tmp_path, 0, **fields), our_plan(tmp_path, 0, **fields)
    # one generation of 4 completions (2 prompts) per 2 optimizer steps: 3 epochs x 8 generations x 2 = 48 steps
    assert theirs["steps"] == ours["steps"] == 48
    assert ours["prompts"] == theirs["prompts"] and all(len(p) == 2 for p in ours["prompts"])
    assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12)
