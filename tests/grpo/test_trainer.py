"""The shared loop end to end on tiny twins: runs, freezes, resumes, learns, splits across processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.adapters.registry import family_class
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false"]


def run_config(out: Path, *overrides: str):
    return load_config(overrides=["--output-dir", str(out), *FAST, *overrides])


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_frozen_groups_stay_identical_and_lrs_apply(tmp_path):
    cfg = run_config(tmp_path, "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--freeze", "vision",
                     "--projector-lr", "3e-3", "--language-lr", "2e-3", "--head-lr", "1e-3")
    trainer = GRPOTrainer.from_settings(cfg)
    groups = trainer.adapter.module_groups()
    before = {n: p.detach().clone() for n, p in trainer.adapter.model.named_parameters()}
    trained(trainer)
    after = dict(trainer.adapter.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in groups["vision"])
    for group in ("projector", "language", "head"):
        assert any(not torch.equal(before[n], after[n]) for n in groups[group]), group
    lrs = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert lrs == {"projector": 3e-3, "language": 2e-3, "head": 1e-3}


def test_step_time_is_the_steps_own_wall_time_rollout_included(tmp_path, monkeypatch):
    from vlm_grpo.grpo.loop.grpo_stage import GRPOStage

    seen, original = [], GRPOStage.train_step

    def watched(self, step):
        started = time.perf_counter()
        metrics = original(self, step)
        seen.append((self.timings["rollout"], metrics["step_time"], time.perf_counter() - started))
        return metrics

    monkeypatch.setattr(GRPOStage, "train_step", watched)
    trained(GRPOTrainer.from_settings(run_config(tmp_path, "--model", "tiny:qwen2_5_vl", "--max-steps", "2")))
    assert len(seen) == 2 and all(0 < rollout < logged <= wall for rollout, logged, wall in seen)  # counted once
    logged = [row["step_time"] for row in read_jsonl(tmp_path / "metrics.jsonl")]
    assert logged == [step_time for _, step_time, _ in seen]


def _comparable(rows):
    return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]


def test_resume_gives_the_same_run(tmp_path):
    common = ["--model", "tiny:qwen2_5_vl", "--learning-rate", "1e-3", "--beta", "0.04", "--num-iterations", "2"]
    straight = tmp_path / "straight"
    trained(GRPOTrainer.from_settings(run_config(straight, *common, "--max-steps", "4")))

    split = tmp_path / "split"
    trained(GRPOTrainer.from_settings(run_config(split, *common, "--max-steps", "4", "--save-every", "2")))  # leaves checkpoint-2 ...
    for extra in ("checkpoint-4", "final"):  # ... then pretend the run died after it
        import shutil

        shutil.rmtree(split / extra)
    lines = (split / "metrics.jsonl").read_text().splitlines()
    (split / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")  # a half-logged step 3 before the kill
    resumed = GRPOTrainer.from_settings(run_config(split, *common, "--max-steps", "4", "--resume"))
    trained(resumed)

    a, b = weights(straight / "final"), weights(split / "final")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _comparable(read_jsonl(straight / "metrics.jsonl")) == _comparable(read_jsonl(split / "metrics.jsonl"))


def test_loop_learns_a_learnable_reward(tmp_path):
    cfg = run_config(tmp_path, "--model", "tiny:qwen2_5_vl", "--max-steps", "30", "--learning-rate", "1e-2",
                     "--num-generations", "8", "--data.rewards", "tests.grpo.toy_rewards:lowercase_share",
                     "--log-completions", "false")
    history = trained(GRPOTrainer.from_settings(cfg))
    rewards = [m["reward"] for m in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + 0.2, rewards


def test_lora_run_with_reference_from_disabled_adapter(tmp_path):
    cfg = run_config(tmp_path, "--model", "tiny:internvl", "--max-steps", "2", "--lora.r", "4", "--beta", "0.04",
                     "--learning-rate", "1e-2")
    trainer = GRPOTrainer.from_settings(cfg)
    assert trainer.reference is None  # the reference is the policy with its adapter switched off
    history = trained(trainer)
    assert history[-1]["kl"] > 0
    assert (tmp_path / "final" / "adapter_model.safetensors").is_file()
    merged = family_class("internvl").model_class.from_pretrained(tmp_path / "final" / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_lora_with_a_projector_trained_whole_keeps_the_reference_and_saves_it(tmp_path):
    """LoRA on the language model + the projector trained whole (trainable_patterns): the projector trains as a
    copy, the reference (adapter off) keeps the original, and final/ (adapter and merged) holds the trained one."""
    cfg = run_config(tmp_path, "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--lora.r", "4", "--beta", "0.04",
                     "--learning-rate", "1e-2", "--optim.trainable_patterns", "[merger]")
    trainer = GRPOTrainer.from_settings(cfg)
    params = dict(trainer.adapter.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    trained(trainer)
    copies = [n for n in params if "merger" in n and ".modules_to_save." in n]
    originals = [n for n in params if "merger" in n and ".original_module." in n]
    assert copies and len(copies) == len(originals)
    assert all(torch.equal(params[n], before[n]) for n in originals)  # the reference's projector
    assert any(not torch.equal(params[n], before[n]) for n in copies)
    saved = load_file(tmp_path / "final" / "adapter_model.safetensors")
    assert any("merger" in k and "lora" not in k for k in saved)
    merged = family_class("qwen2_5_vl").model_class.from_pretrained(tmp_path / "final" / "merged")
    merged_params = dict(merged.named_parameters())
    for name in copies:
        plain = name.replace("base_model.model.", "").replace(".modules_to_save.default", "")
        assert torch.equal(merged_params[plain], params[name].detach()), plain


def test_unknown_recipe_and_bad_settings_are_clear(tmp_path):
    with pytest.raises(ValueError, match="available recipes: .*shapes"):
        GRPOTrainer.from_settings(run_config(tmp_path, "--recipe", "nope"))
    with pytest.raises(ValueError, match="unknown setting"):
        run_config(tmp_path, "--no-such-setting", "1")
    assert json.dumps(run_config(tmp_path).to_dict())


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_gradient_accumulation_matches_one_big_batch(tmp_path, loss_type):
    # a dense reward: every group has a spread, so every completion carries a gradient
    common = ["--model", "tiny:qwen2_5_vl", "--max-steps", "1", "--learning-rate", "1e-3", "--loss-type", loss_type,
              "--optim.max_grad_norm", "0", "--log-completions", "false",
              "--data.rewards", "lower=tests.grpo.toy_rewards:lowercase_share"]
    one = GRPOTrainer.from_settings(run_config(tmp_path / "one", *common))
    trained(one)
    two = GRPOTrainer.from_settings(run_config(tmp_path / "two", *common, "--gradient-accumulation-steps", "2"))
    trained(two)
    # Adam's first moment after one step is 0.1 * gradient: compare the gradients themselves
    # (Adam's first update is nearly scale-free, so weights alone would hide a wrong loss scale).
    def first_moments(trainer):
        return [trainer.optimizer.state[p]["exp_avg"] for g in trainer.optimizer.param_groups for p in g["params"]]

    # Summing in two halves rounds differently in fp32: entries near zero are compared against the tensor's
    # scale, which still catches a loss scaled by the wrong factor (an error of 50% or more).
    for x, y in zip(first_moments(one), first_moments(two), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4 * float(y.abs().max()))
    assert any(m.abs().max() > 0 for m in first_moments(one))


def test_yaml_config_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {name: 'tiny:smolvlm'}\nloss: {beta: 0.04, loss_type: grpo}\nmax_steps: 7\nvision_lr: 1.0e-6\n")
    cfg = load_config(path, ["--max-steps", "9", "--loss.epsilon", "0.3"])
    assert cfg.model.name == "tiny:smolvlm" and cfg.loss.beta == 0.04 and cfg.loss.loss_type == "grpo"
    assert cfg.max_steps == 9 and cfg.loss.epsilon == 0.3 and cfg.optim.vision_lr == 1e-6
    with pytest.raises(ValueError, match="not a valid int"):
        load_config(path, ["--max-steps", "many"])


def test_logprobs_are_taken_at_the_sampling_temperature(tmp_path):
    """Ratio, KL and entropy use the distribution the completions came from: softmax(logits / T), as in TRL."""
    from vlm_grpo.adapters.teacher_forcing import completion_logits
    from vlm_grpo.grpo.rollout.generation import rollout
    from vlm_grpo.recipes.shapes import build

    cfg = run_config(tmp_path, "--model", "tiny:qwen2_5_vl", "--temperature", "0.5")
    trainer = GRPOTrainer.from_settings(cfg)
    adapter = trainer.adapter
    samples = [build(size=2, image_size=56)[i] for i in range(2)]
    with torch.no_grad():
        ro = rollout(adapter, samples, cfg.generation, 2, "cpu")
        rows = list(range(4))
        scores = trainer.scorer.scores(ro, rows, adapter.model, with_entropy=True)
        got, entropy = scores.logps, scores.entropy
        logits = completion_logits(adapter, ro.prompts.select(ro.prompt_index(rows)), ro.completion_ids, ro.completion_mask)
    for temperature, expect_match in ((0.5, True), (1.0, False)):
        full = torch.log_softmax(logits.float() / temperature, -1)
        want = full.gather(-1, ro.completion_ids.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(got, want, atol=1e-5) == expect_match
        assert torch.allclose(entropy, -(full.exp() * full).sum(-1), atol=1e-4) == expect_match
