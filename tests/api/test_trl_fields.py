"""Every field of the installed TRL's GRPOConfig is classified (api/trl_fields.py), TRL's defaults are all accepted,
the docs table is current, and the batch, length, optimizer and model translations give what TRL itself resolves."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

trl = pytest.importorskip("trl")

from vlm_grpo import GRPOConfig  # noqa: E402
from vlm_grpo.api.trl_fields import HONOURED, NO_EFFECT, REFUSED, RULES, trl_defaults  # noqa: E402
from vlm_grpo.api.trl_fields_doc import DOC, table_markdown  # noqa: E402


def test_every_field_of_the_installed_trl_is_classified():
    names = [f.name for f in dataclasses.fields(trl.GRPOConfig)]  # a TRL release that adds one fails here
    unclassified = [n for n in names if n not in RULES]
    assert not unclassified, f"classify these TRL GRPOConfig fields in vlm_grpo/api/trl_fields.py: {unclassified}"
    assert {RULES[n].status for n in names} == {HONOURED, NO_EFFECT, REFUSED}
    assert all(RULES[n].note for n in names if RULES[n].status != HONOURED)  # a warning or refusal says why
    assert all(RULES[n].setting for n in names if RULES[n].status == HONOURED)


def test_trl_defaults_are_accepted_one_at_a_time_and_all_together():
    defaults = trl_defaults()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # TRL's default of a no-effect field does not even warn
        for name, value in defaults.items():
            GRPOConfig(**{name: value})
        everything = GRPOConfig(**defaults)
    cfg = everything.train_config
    # TRL's defaults resolved as TRL does: 8 completions per device = 1 prompt x 8 generations, 3 epochs
    assert (cfg.data.batch_size, cfg.data.num_generations, cfg.epochs) == (1, 8, 3.0)
    assert cfg.optim.optimizer == "adamw_torch_fused" and cfg.optim.lr_scheduler == "linear"
    assert cfg.logging.report_to == [] and cfg.logging.keep_checkpoints == 0 and cfg.logging.save_every == 500
    assert everything.logging_steps == 10 and everything.eval_strategy == "no"  # read back as TRL's


def test_the_docs_table_is_current():
    assert DOC.read_text(encoding="utf-8") == table_markdown(), "run: make trl-fields-doc"


def test_no_effect_fields_warn_once_and_refused_fields_name_what_to_use():
    with pytest.warns(UserWarning, match=r"deepspeed='ds.json' has no effect here: DeepSpeed is configured by "
                                         r"`accelerate launch --use_deepspeed`"):
        GRPOConfig(deepspeed="ds.json")
    with pytest.raises(ValueError, match=r"setting 'load_best_model_at_end': True cannot be honoured here: the final "
                                         r"model is the last step's"):
        GRPOConfig(load_best_model_at_end=True)
    with pytest.raises(ValueError, match=r"setting 'use_vllm, hub_revision': use_vllm: vLLM rollouts: see "
                                         r"issue/README; hub_revision: 'dev' cannot be honoured"):
        GRPOConfig(use_vllm=True, hub_revision="dev")
    with pytest.raises(ValueError, match=r"'steps_per_generation': 3 is not a multiple of gradient_accumulation_steps"):
        GRPOConfig(per_device_train_batch_size=4, steps_per_generation=3, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match=r"'model_init_kwargs': trust_remote_code inside model_init_kwargs: give "
                                         r"trust_remote_code=True to GRPOConfig itself"):
        GRPOConfig(model_init_kwargs={"trust_remote_code": True})
    with pytest.raises(ValueError, match=r"'save_strategy': 'best' picks checkpoints by an evaluation metric"):
        GRPOConfig(save_strategy="best")


@pytest.mark.parametrize("given", [
    {"per_device_train_batch_size": 8, "num_generations": 4},
    {"per_device_train_batch_size": 2, "num_generations": 2, "gradient_accumulation_steps": 3},
    {"per_device_train_batch_size": 4, "num_generations": 4, "generation_batch_size": 8,
     "gradient_accumulation_steps": 2},
    {"per_device_train_batch_size": 6, "num_generations": 3, "steps_per_generation": 2,
     "gradient_accumulation_steps": 2},
])
def test_batch_sizes_give_trls_prompts_per_generation_and_completions_per_update(given, tmp_path):
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **given)
    ours = GRPOConfig(**given).train_config
    prompts_per_generation = theirs.generation_batch_size // theirs.num_generations
    completions_per_update = theirs.per_device_train_batch_size * theirs.gradient_accumulation_steps
    assert theirs.steps_per_generation == theirs.gradient_accumulation_steps  # one generation per update, as here
    assert ours.data.batch_size == prompts_per_generation
    assert ours.data.batch_size * ours.data.num_generations == completions_per_update
    assert ours.data.batch_size % ours.gradient_accumulation_steps == 0  # micro-batches of whole groups


def test_length_logging_saving_and_model_fields_translate_with_trls_meaning():
    cfg = GRPOConfig(num_train_epochs=2, max_steps=-1).train_config
    assert cfg.epochs == 2.0
    cfg = GRPOConfig(num_train_epochs=2, max_steps=7).train_config  # max_steps > 0 wins, as in TRL
    assert (cfg.epochs, cfg.max_steps) == (0.0, 7)
    cfg = GRPOConfig(max_steps=10, save_strategy="steps", save_steps=0.25, save_total_limit=None).train_config
    assert (cfg.logging.save_every, cfg.logging.keep_checkpoints, cfg.logging.checkpoint_at_end) == (3, 0, True)
    cfg = GRPOConfig(save_strategy="no").train_config
    assert (cfg.logging.save_every, cfg.logging.checkpoint_at_end) == (0, False)
    cfg = GRPOConfig(report_to=["tensorboard"], logging_steps=5, disable_tqdm=True, warmup_steps=0.1,
                     lr_scheduler_kwargs={"num_cycles": 2}, adam_beta2=0.95, adam_epsilon=1e-6, optim="sgd",
                     model_init_kwargs={"dtype": "bfloat16", "attn_implementation": "eager", "device_map": "cpu"},
                     generation_kwargs={"temperature": 0.7, "no_repeat_ngram_size": 3}, repetition_penalty=1.1,
                     min_p=0.05, chat_template_kwargs={"enable_thinking": False}, reward_weights=None,
                     shuffle_dataset=False, data_seed=7).train_config
    assert cfg.logging.report_to == ["tensorboard"] and cfg.logging.log_every == 5 and not cfg.logging.progress
    assert cfg.optim.warmup_ratio == 0.1 and cfg.optim.lr_scheduler_kwargs == {"num_cycles": 2}
    assert cfg.optim.adam_betas == (0.9, 0.95) and cfg.optim.adam_eps == 1e-6 and cfg.optim.optimizer == "sgd"
    assert (cfg.model.dtype, cfg.model.attn_implementation, cfg.model.device) == ("bfloat16", "eager", "cpu")
    assert cfg.generation.temperature == 0.7 and cfg.generation.generation_kwargs == {"no_repeat_ngram_size": 3}
    assert cfg.generation.repetition_penalty == 1.1 and cfg.generation.min_p == 0.05
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False} and cfg.data.reward_weights == []
    assert cfg.data.shuffle is False and cfg.data.data_seed == 7
    from transformers.integrations import get_available_reporting_integrations

    from vlm_grpo.grpo.settings.sections import TRACKERS

    installed = [t for t in get_available_reporting_integrations() if t in TRACKERS]
    assert GRPOConfig(report_to="all").train_config.logging.report_to == installed
    assert GRPOConfig(report_to="none").train_config.logging.report_to == []
    with pytest.raises(ValueError, match="'logging.report_to': 'nosuch' is not one of"):
        GRPOConfig(report_to="nosuch")


def test_the_optimizers_are_transformers_own(tmp_path):
    """Each name builds the class and arguments transformers' Trainer builds for it (bitsandbytes' where installed)."""
    import torch
    from transformers import Trainer, TrainingArguments

    from vlm_grpo.grpo.settings.sections import OPTIMIZERS, OptimConfig
    from vlm_grpo.grpo.training.optimizer import optimizer_class

    for name in OPTIMIZERS:
        if "bnb" in name or "paged" in name:
            pytest.importorskip("bitsandbytes")
        ours = optimizer_class(OptimConfig(optimizer=name, learning_rate=3e-4, adam_betas=(0.8, 0.9), adam_eps=1e-7))
        args = TrainingArguments(output_dir=str(tmp_path), optim=name, learning_rate=3e-4, adam_beta1=0.8,
                                 adam_beta2=0.9, adam_epsilon=1e-7, use_cpu=True, report_to="none")
        theirs = Trainer.get_optimizer_cls_and_kwargs(args)
        assert ours[0] is theirs[0] and {**theirs[1], "weight_decay": 0.0} == ours[1]
    param = torch.nn.Parameter(torch.ones(3))
    cls, kwargs = optimizer_class(OptimConfig(optimizer="adafactor"))
    cls([param], **kwargs).step()  # runs here


def test_gradient_checkpointing_kwargs_reach_torch_checkpoint():
    from transformers.modeling_layers import GradientCheckpointingLayer

    from vlm_grpo.grpo.training import gradient_checkpointing
    from vlm_grpo.loader import load_model

    model = load_model("tiny:smolvlm").model
    kwargs = GRPOConfig(gradient_checkpointing_kwargs={"use_reentrant": True}).train_config.perf.gradient_checkpointing_kwargs
    assert gradient_checkpointing.enable(model, kwargs) > 0
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    assert {m._gradient_checkpointing_func.keywords["use_reentrant"] for m in layers} == {True}
