"""The Python API as TRL users write it: the README's example (examples/python_api.py) runs, an eval_dataset and a
peft_config run train, a model object trains and its card names its base, callbacks see every step and can stop the
run, and what cannot be honoured is refused by name."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import yaml
from huggingface_hub import constants

from tests.grpo.fake_hub import FakeHub
from tests.recipes.helpers import image
from vlm_grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from vlm_grpo.grpo.run.logs import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
# logging_steps 1 and log_completions: a script that sets them (TRL's defaults are every 10 steps, none)
FAST = {"max_steps": 2, "batch_size": 2, "num_generations": 2, "max_completion_length": 4, "progress": False,
        "logging_steps": 1, "log_completions": True}
COLOURS = ["red", "green", "blue", "orange"]


def rows(question: str = "Which colour is square {i}?") -> list[dict]:
    return [{"prompt": question.format(i=i), "image": image(i), "solution": COLOURS[i]} for i in range(4)]


def says_colour(completions, solution, **kwargs):
    return [float(answer in text) for text, answer in zip(completions, solution)]


def card_of(folder: Path):
    from huggingface_hub import ModelCard

    return ModelCard.load(folder / "README.md")


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    script = (ROOT / "examples" / "python_api.py").read_text()
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Coming from TRL"):]
    assert section.split("```python\n", 1)[1].split("```", 1)[0] == script  # the section opens with the example
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(ROOT / "examples" / "python_api.py"), run_name="python_api_example")
    run = tmp_path / "runs" / "colours"
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert {"rewards/accuracy", "rewards/think_format_reward"} <= set(read_jsonl(run / "metrics.jsonl")[0])
    settings = yaml.safe_load((run / "config.yaml").read_text())
    assert settings["data"]["rewards"] == ["accuracy=python_api_example:accuracy*1",
                                           "think_format_reward=trl.rewards:think_format_reward*1"]
    record = settings["data"]["dataset"]
    assert record.startswith("memory:Dataset(fingerprint=") and record.endswith("columns=[prompt, image, solution], rows=4)")
    assert settings["data"]["recipe"] == "trl" and settings["model"]["name"] == "tiny:smolvlm"
    card = (run / "final" / "README.md").read_text()
    assert f"`{record}`" in card and "`accuracy` (x1, `python_api_example:accuracy`)" in card
    assert (run / "final" / "model.safetensors").is_file()


def test_an_eval_dataset_run_evaluates_on_it(tmp_path):
    import datasets

    held_out = datasets.Dataset.from_list(rows("Held-out square {i}: which colour?")[:3])
    args = GRPOConfig(output_dir=str(tmp_path / "run"), eval={"before_after": True, "size": 3, "eval_batch_size": 3},
                      **FAST)
    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=says_colour, args=args, train_dataset=rows(),
                          eval_dataset=held_out)
    trainer.train()
    after = json.loads((tmp_path / "run" / "eval-after.json").read_text())
    assert [s["prompt"] for s in after["samples"]] == [f"Held-out square {i}: which colour?" for i in range(3)]
    metrics = trainer.evaluate()
    # greedy answers (this project's) beside TRL's sampled evaluation (eval_loss, eval_reward, per-reward mean/std)
    assert set(metrics) == {"eval_completion_length", "eval_greedy_reward", "eval_rewards/says_colour", "eval_loss",
                            "eval_reward", "eval_reward_std", "eval_rewards/says_colour/mean",
                            "eval_rewards/says_colour/std"}
    assert trainer.last_evaluation["size"] == 3
    other = trainer.evaluate(eval_dataset=rows("Another {i}?")[:2])
    assert [s["prompt"] for s in trainer.last_evaluation["samples"]] == ["Another 0?", "Another 1?"] and other
    assert trainer.cfg.data.eval_dataset.endswith("rows=3)")  # that evaluation's data was for it alone
    settings = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert settings["data"]["eval_dataset"].startswith("memory:Dataset(") and "rows=3" in settings["data"]["eval_dataset"]
    trainer.save_model()
    metric_names = [m.metric_name for m in card_of(tmp_path / "run" / "final").data.eval_results]
    assert metric_names == ["reward", "rewards/says_colour"]  # the held-out results as model-index metrics


def test_a_peft_config_run_saves_a_lora_adapter_and_pushes_it(tmp_path, monkeypatch):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(), peft_config=lora,
                          args=GRPOConfig(output_dir=str(tmp_path / "run"), **FAST))
    output = trainer.train()
    trainer.save_model()  # final/, as a TRL script saves it
    assert output.global_step == 2 and "train_runtime" in output.metrics
    final = tmp_path / "run" / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and adapter["target_modules"]
    assert all(name.endswith(("q_proj", "v_proj")) for name in adapter["target_modules"])
    assert card_of(final).data.library_name == "peft" and "lora" in card_of(final).data.tags
    assert trainer.cfg.lora.r == 4
    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    try:
        url = trainer.push_to_hub("me/tiny-lora")
    finally:
        hub.close()
    pushed = tmp_path / "hub" / "me" / "tiny-lora"
    assert "me/tiny-lora" in url and (pushed / "adapter_model.safetensors").read_bytes() == (
        final / "adapter_model.safetensors").read_bytes()
    assert card_of(pushed).data.model_name == "me/tiny-lora" and "# me/tiny-lora" in (pushed / "README.md").read_text()
    with pytest.raises(ValueError, match=r"peft_config: use_dora=True has no same-meaning setting here"):
        GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(),
                    peft_config=LoraConfig(r=4, use_dora=True), args=GRPOConfig(output_dir=str(tmp_path / "x"), **FAST))


def test_a_model_object_trains_and_its_card_names_its_base(tmp_path):
    from transformers import AutoModelForImageTextToText

    from vlm_grpo.adapters.registry import family_class

    twin = family_class("smolvlm").tiny(seed=0)
    base = tmp_path / "base"
    twin.save(base)
    (base / "README.md").write_text("---\nbase_model: someone/tiny-vlm\nlicense: apache-2.0\n---\n# a local copy\n")
    model = AutoModelForImageTextToText.from_pretrained(base)
    trainer = GRPOTrainer(model=model, reward_funcs=[says_colour], train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path / "run"), **FAST))
    assert trainer.model is model
    trainer.train()
    trainer.save_model()
    card = card_of(tmp_path / "run" / "final")
    assert card.data.base_model == "someone/tiny-vlm" and card.data.license == "apache-2.0"
    assert f"from `{base}` (smolvlm family)" in card.text
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]["name"] == str(base)
    built = family_class("smolvlm").tiny(seed=0)  # built in Python, no path: given with its processor
    other = GRPOTrainer(model=built.model, processing_class=built.processor, reward_funcs=[says_colour],
                        train_dataset=rows(), args=GRPOConfig(output_dir=str(tmp_path / "other"), **FAST))
    assert other.cfg.model.name == "memory:SmolVLMForConditionalGeneration"
    with pytest.raises(ValueError, match="built in Python with no path to load its processor from: give processing_class"):
        GRPOTrainer(model=built.model, reward_funcs=[says_colour], train_dataset=rows())


def test_callbacks_see_each_step_and_can_stop_the_run(tmp_path):
    from transformers import TrainerCallback, TrainerState

    seen = []

    class Stopper(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.append(("begin", state.max_steps, args.max_completion_length))

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(("log", state.global_step, "reward" in logs))
            if state.global_step == 2:
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            seen.append(("end", state.global_step, len(state.log_history)))

    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], train_dataset=rows(), callbacks=[Stopper],
                          args=GRPOConfig(output_dir=str(tmp_path / "run"), **{**FAST, "max_steps": 5}))
    trainer.train()
    trainer.save_model()
    # the Trainer's last log (runtime, mean loss) comes before on_train_end, as in transformers
    assert seen == [("begin", 5, 4), ("log", 1, True), ("log", 2, True), ("log", 2, False), ("end", 2, 3)]
    assert (tmp_path / "run" / "final").is_dir()
    state = TrainerState.load_from_json(str(tmp_path / "run" / "checkpoint-2" / "trainer_state.json"))
    assert state.global_step == 2 and state.max_steps == 5 and [m["step"] for m in state.log_history] == [1, 2]


def test_sft_trains_on_the_completion_column(tmp_path):
    data = [{**row, "completion": f"It is {row['solution']}."} for row in rows()]
    trainer = SFTTrainer(model="tiny:smolvlm", args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2,
                                                              batch_size=2, progress=False), train_dataset=data)
    output = trainer.train()
    assert output.global_step == 2 and output.training_loss > 0
    assert (tmp_path / "sft" / "final" / "model.safetensors").is_file()


def test_the_config_checks_its_values_and_reads_back_trl_names(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=64, bf16=True, lora={"r": 8}, beta=0.04)
    assert args.max_completion_length == 64 and args.max_new_tokens == 64 and args.bf16 and not args.fp16
    assert args.train_config.lora.r == 8 and args.beta == 0.04 and args.output_dir == str(tmp_path)
    args.learning_rate = 3e-4
    assert args.train_config.optim.learning_rate == 3e-4 and args.beta == 0.04
    assert GRPOConfig().output_dir == "trainer_output" and SFTConfig().output_dir == "runs/sft-latest"  # TRL's
    with pytest.raises(ValueError, match=r"setting 'use_vllm': vLLM rollouts: see issue/README"):
        GRPOConfig(per_device_train_batch_size=8, logging_steps=5, use_vllm=True)
    with pytest.raises(ValueError, match=r"setting 'loss.epsilon': 5.0 is out of range"):
        GRPOConfig(epsilon=5)
    with pytest.raises(AttributeError, match="has no setting 'no_such_thing'"):
        args.no_such_thing
    from vlm_grpo.grpo.settings.sections import TrainConfig

    plain = TrainConfig(model="tiny:smolvlm", loss={"beta": 0.1})  # the dataclasses themselves, from Python
    assert plain.model.name == "tiny:smolvlm" and plain.loss.beta == 0.1
    with pytest.raises(ValueError, match="setting 'data': is a section: give a DataConfig or a mapping of its fields"):
        TrainConfig(data=3)


def test_what_cannot_be_honoured_is_refused_by_name():
    with pytest.raises(ValueError, match="optimizers: the optimizer is built here"):
        GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], optimizers=(object(), None), train_dataset=rows())
