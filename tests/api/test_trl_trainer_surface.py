"""The trainer's TRL surface: add/pop/remove_callback on transformers' callbacks, on_save after each checkpoint,
trainer.accelerator, TRL's rollout_func (its completions trained on, its extra keys handed to the rewards), and the
settings TRL names that shape a run (optimizer, schedule, generation, data order) reaching it."""

from __future__ import annotations

import pytest
from transformers import PrinterCallback, TrainerCallback

from tests.api.test_python_api import FAST, rows, says_colour
from vlm_grpo import GRPOConfig, GRPOTrainer
from vlm_grpo.grpo.run.logs import read_jsonl


class Events(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_save(self, args, state, control, **kwargs):
        self.seen.append(("save", state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(("step", state.global_step))


class Other(TrainerCallback):
    pass


def test_callbacks_are_added_popped_and_removed_as_in_trl_and_hear_each_save(tmp_path):
    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path / "run"), save_steps=1, **FAST),
                          callbacks=[PrinterCallback])
    events = Events()
    trainer.add_callback(events)
    trainer.add_callback(Other)
    popped = trainer.pop_callback(PrinterCallback)
    assert isinstance(popped, PrinterCallback) and trainer.pop_callback(PrinterCallback) is None
    trainer.remove_callback(Other)
    assert [type(cb).__name__ for cb in trainer.callback_handler.callbacks] == ["DefaultFlowCallback", "Events"]
    assert trainer.accelerator is trainer.accelerator and trainer.accelerator.num_processes == 1
    trainer.train()
    trainer.log({"custom": 1.0})
    assert trainer.state.log_history[-1] == {"custom": 1.0, "epoch": trainer.state.epoch, "step": 2}
    # transformers saves after the step's end; here a checkpoint is written before the step hook: both per step
    assert sorted(events.seen) == [("save", 1), ("save", 2), ("step", 1), ("step", 2)]


def test_scheduled_evaluation_without_held_out_data_stops_when_the_trainer_is_made(tmp_path):
    with pytest.raises(ValueError, match=r"eval_strategy='steps': rows given in Python have no held-out split; give "
                                         r"GRPOTrainer\(eval_dataset=...\)"):
        GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                    args=GRPOConfig(output_dir=str(tmp_path / "run"), eval_strategy="steps", **FAST))


def test_rollout_func_completions_are_trained_on_and_its_fields_reach_the_rewards(tmp_path):
    seen = {}

    def rollout_func(prompts, trainer):
        tokenizer = trainer.processing_class.tokenizer
        seen["prompts"], seen["trainer"] = prompts, trainer
        ids = [tokenizer.encode(f" red {i}", add_special_tokens=False) for i in range(len(prompts))]
        return {"prompt_ids": [[0]] * len(prompts), "completion_ids": ids, "logprobs": [[0.0] * len(i) for i in ids],
                "source": [f"mine-{i}" for i in range(len(prompts))]}

    def reads_source(completions, source, **kwargs):
        seen.setdefault("rewarded", []).append((list(completions), list(source)))
        return [1.0 if "red" in c else 0.0 for c in completions]

    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[reads_source], train_dataset=rows(),
                          rollout_func=rollout_func, args=GRPOConfig(output_dir=str(tmp_path / "run"),
                                                                     **{**FAST, "max_steps": 1}))
    trainer.train()
    assert seen["trainer"] is trainer and len(seen["prompts"]) == 4  # 2 prompts x 2 generations, as TRL hands them
    assert seen["prompts"][0] == seen["prompts"][1] != seen["prompts"][2]
    completions, source = seen["rewarded"][-1]
    assert [c.strip() for c in completions] == [f"red {i}" for i in range(4)] and source == [f"mine-{i}" for i in range(4)]
    logged = read_jsonl(tmp_path / "run" / "completions.jsonl")
    assert [row["completion"].strip() for row in logged] == [f"red {i}" for i in range(4)]


def test_trl_run_settings_reach_the_run(tmp_path, monkeypatch):
    """Optimizer by name, schedule kwargs, generation extras and the chat template's arguments, data order, full
    determinism and the log level."""
    import logging

    import torch

    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):
        monkeypatch.setenv(name, "")  # enable_full_determinism sets them: restored after the test
    level = logging.getLogger("vlm_grpo").level
    args = GRPOConfig(full_determinism=True, log_level="error", output_dir=str(tmp_path / "run"), **{**FAST, "max_steps": 1}, optim="sgd",
                      lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2}, min_p=0.1,
                      repetition_penalty=1.3, generation_kwargs={"no_repeat_ngram_size": 2}, shuffle_dataset=False,
                      chat_template_kwargs={"add_vision_id": True})
    try:
        trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(), args=args)
        assert torch.are_deterministic_algorithms_enabled()
        assert logging.getLogger("vlm_grpo").level == logging.ERROR
    finally:
        torch.use_deterministic_algorithms(False)
        logging.getLogger("vlm_grpo").setLevel(level)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_warning()
    run = trainer
    assert type(run.optimizer.optimizer if hasattr(run.optimizer, "optimizer") else run.optimizer) is torch.optim.SGD
    assert run.lr_scheduler.lr_lambdas[0].keywords["num_cycles"] == 2
    from vlm_grpo.grpo.training.policy import sampling_with

    config = run.adapter.model.generation_config
    own = (config.min_p, config.repetition_penalty, config.no_repeat_ngram_size)
    with sampling_with(run.adapter.model, run.cfg.generation):  # rollouts generate with them ...
        assert (config.min_p, config.repetition_penalty, config.no_repeat_ngram_size) == (0.1, 1.3, 2)
    assert (config.min_p, config.repetition_penalty, config.no_repeat_ngram_size) == own  # ... the model keeps its own
    assert run.adapter.chat_template_kwargs == {"add_vision_id": True}
    # shuffle_dataset=False: rows in order, every pass (4 rows, 2 a step: a shuffled order matches 1 time in 576)
    assert [run.data.batch(step).rows for step in range(4)] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    with pytest.raises(ValueError, match="'no_such_field' is not a transformers GenerationConfig field"):
        GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                    args=GRPOConfig(output_dir=str(tmp_path / "bad"), **FAST, generation_kwargs={"no_such_field": 1}))


def test_a_run_counted_in_epochs_resumes_to_more_epochs(tmp_path):
    settings = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=4, progress=False, save_steps=1)
    first = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                        args=GRPOConfig(num_train_epochs=1, **settings))
    assert first.train().global_step == 2  # 4 rows, 2 prompts per step: 2 steps per epoch
    # the run directory is checked when the trainer is made: the resume is asked for there (TRL's field)
    again = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                        args=GRPOConfig(num_train_epochs=2, resume_from_checkpoint=True, **settings))
    assert again.train().global_step == 4
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4]


@pytest.mark.parametrize("min_p", [None, 1.0])
def test_min_p_reaches_the_sampler(min_p, tmp_path):
    """min_p=1.0 keeps only the most likely token: a prompt's completions are then all the same; without it the
    tiny twin's sampled completions differ."""
    groups = []

    def record(completions, **kwargs):
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        groups.extend(texts[i:i + 4] for i in range(0, len(texts), 4))
        return [0.0] * len(texts)

    args = GRPOConfig(output_dir=str(tmp_path / "run"), **{**FAST, "max_steps": 1, "num_generations": 4,
                                                           "max_completion_length": 8}, min_p=min_p)
    GRPOTrainer(model="tiny:smolvlm", reward_funcs=[record], train_dataset=rows(), args=args).train()
    same = [len(set(group)) == 1 for group in groups[-2:]]  # the step's 2 prompts (the audit's calls come first)
    assert all(same) if min_p else not all(same)
