"""The arms of an experiment: more models trained from the SFT checkpoint beside GRPO, so that GRPO's gain is measured
against what the same prompts teach without it. Each arm is a stage (`vlm-grpo experiment CONFIG --stages NAME`),
evaluated beside GRPO; its `method` says what it does:

- grpo: a GRPO variant: the grpo stage's settings with the arm's `set` over them (longer, more generations, another
  temperature, beta 0, another loss) on GRPO's prompts (the same data order);
- answer_sft: SFT on the prompts GRPO sees (the rows its max_steps x batch_size draws, in its order; of
  `question_types` only, when given), the target the answer alone in the recipe's layout
  (`<think>square</think>\\n<answer>square</answer>`): what the correctness reward knows, given as supervision;
- rft: rejection-sampling fine-tuning (STaR; RFT): the SFT model samples G completions of every GRPO prompt with
  GRPO's sampler and generation settings (the same prompts and sample budget), keeps those the accuracy reward
  accepts, and is fine-tuned on them (sft settings). The accepted completions are written to seedN/NAME.accepted.json
  first, so a stopped stage resumes without sampling again;
- sft_more: the SFT stage trained on for as many extra rows as GRPO sees prompts (max_steps x batch_size): fresh rows
  of SFT's own task (GRPO's data order seed).

The SFT arms run one pass over their rows (steps = rows / batch size, rounded up) unless their `set` names max_steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any, Callable

import torch

from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.grpo import safe_files
from vlm_grpo.experiment.stages import stage_settings, train_stage


def grpo_prompts(exp: Experiment, seed: int):
    """(GRPO's settings, its recipe, its training split, the rows each of its steps draws): one process's order, as
    the grpo stage of `seed` reads them."""
    from vlm_grpo.grpo.data.order import batch_indices
    from vlm_grpo.grpo.data.recipe_source import build_split
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    cfg, recipe = load_recipe_config(settings=stage_settings(exp, "grpo", seed))
    dataset = build_split(recipe, cfg.data, "train", cfg.data.train_size, cfg.seed)
    order = cfg.seed if cfg.data.data_seed is None else cfg.data.data_seed
    steps = [batch_indices(len(dataset), cfg.data.batch_size, step, order, shuffle=cfg.data.shuffle, order=cfg.data.order)
             for step in range(cfg.max_steps)]
    return cfg, recipe, dataset, steps


def wanted(sample, types: list[str] | None) -> bool:
    return types is None or str((sample.fields or {}).get("question_type")) in types


def answer_rows(exp: Experiment, stage: str, seed: int, say: Callable[[str], None]) -> tuple[list, dict[str, Any]]:
    """GRPO's prompts (of the arm's question types), each with the answer alone as its reference."""
    from vlm_grpo.grpo.guards.hacking_watch import run_hints

    cfg, recipe, dataset, steps = grpo_prompts(exp, seed)
    hints = run_hints(recipe, custom_rewards=bool(cfg.data.rewards))
    types = exp.arms[stage]["question_types"]
    rows = []
    for index in (i for step in steps for i in step):
        sample = dataset[index]
        if not wanted(sample, types):
            continue
        answer = hints.answer(sample)
        if answer is None:
            raise ValueError(f"{stage}: training row {index} of {recipe.name} names no answer (its fields: "
                             f"{sorted(sample.fields)}); answer_sft needs one")
        rows.append(replace(sample, reference=hints.layout(sample, str(answer), str(answer))))
    say(f"{stage}: {len(rows)} of GRPO's {sum(map(len, steps))} prompts, the answer alone as the target")
    return rows, {"grpo_prompts": sum(map(len, steps)), "rows": len(rows)}


def sampled_rows(exp: Experiment, stage: str, seed: int, say: Callable[[str], None]) -> tuple[list, dict[str, Any]]:
    """GRPO's prompts (of the arm's question types), each with every sampled completion the accuracy reward accepts
    as a reference; sampled once, kept in seedN/NAME.accepted.json."""
    cfg, recipe, dataset, steps = grpo_prompts(exp, seed)
    kept_file = exp.seed_dir(seed) / f"{stage}.accepted.json"
    if kept_file.is_file():
        kept = json.loads(kept_file.read_text())
        say(f"{stage}: {kept['accepted']} of {kept['sampled']} completions accepted earlier ({kept_file})")
    else:
        kept = sample_and_keep(cfg, recipe, dataset, steps, exp.arms[stage]["question_types"], stage, say)
        safe_files.write_below(exp.output_dir, kept_file, json.dumps(kept))  # whole or absent: a stopped stage samples again
    rows = [replace(dataset[r["row"]], reference=r["completion"]) for r in kept["rows"]]
    if not rows:
        raise RuntimeError(f"{stage}: the reward accepted none of the {kept['sampled']} sampled completions; there is "
                           f"nothing to fine-tune on ({kept_file})")
    return rows, {key: kept[key] for key in ("prompts", "sampled", "accepted")}


def sample_and_keep(cfg, recipe, dataset, steps: list[list[int]], types: list[str] | None, stage: str,
                    say: Callable[[str], None]) -> dict[str, Any]:
    """G completions of each prompt, step by step as GRPO samples them (its rollout, generation settings, step seeds
    and, with mixed_precision bf16, bf16 weights); those whose accuracy reward is > 0 kept."""
    from vlm_grpo.grpo.data.order import step_seed
    from vlm_grpo.grpo.heldout_eval import run_rewards_of
    from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
    from vlm_grpo.grpo.rewards.weighted import score
    from vlm_grpo.grpo.rollout.generation import rollout
    from vlm_grpo.grpo.training.policy import load_policy, sampling_with

    adapter = load_policy(cfg)
    model = adapter.model.eval()
    if cfg.mixed_precision == "bf16":
        model.to(torch.bfloat16)
    device = next(model.parameters()).device
    rewards = run_rewards_of(recipe, cfg, device)
    accuracy = recipe.accuracy_reward
    if accuracy is None or accuracy not in {r.name for r in rewards}:
        raise ValueError(f"{stage}: rft keeps the completions the accuracy reward accepts; {recipe.name}'s rewards "
                         f"({', '.join(r.name for r in rewards)}) name none")
    g = cfg.data.num_generations
    kept, prompts, sampled = [], 0, 0
    for step, indices in enumerate(steps):
        samples = [dataset[i] for i in indices]
        chosen = [(i, s) for i, s in zip(indices, samples) if wanted(s, types)]
        if not chosen:
            continue
        rows, samples = [i for i, _ in chosen], [s for _, s in chosen]
        torch.manual_seed(step_seed(cfg.seed, step))
        with torch.no_grad(), sampling_with(model, cfg.generation):
            ro = rollout(adapter, samples, cfg.generation, g, device, shared_prefix=cfg.perf.shared_prefix)
        inputs = RewardInputs.from_samples(samples, g, ro.completions, ro.completion_ids, ro.completion_mask,
                                           trainer_state(step, cfg.max_steps))
        _, parts = score(rewards, inputs)
        right = torch.nan_to_num(parts[accuracy].float(), nan=0.0) > 0
        kept += [{"row": rows[j // g], "completion": text} for j, text in enumerate(ro.completions) if right[j]]
        prompts, sampled = prompts + len(samples), sampled + len(ro.completions)
        if (step + 1) % max(1, len(steps) // 5) == 0:
            say(f"{stage}: sampled {step + 1}/{len(steps)} steps, {len(kept)} of {sampled} completions accepted")
    return {"prompts": prompts, "sampled": sampled, "accepted": len(kept), "rows": kept}


def sft_budget(settings: dict[str, Any], arm: dict[str, Any], rows: int) -> dict[str, Any]:
    """An SFT arm's settings for `rows` rows: one pass (steps = rows / batch, rounded up; the batch at most the rows)
    unless the arm's `set` names max_steps."""
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    batch = min(load_recipe_config(settings=settings)[0].data.batch_size, rows)
    out = {**settings, "data": {**settings.get("data", {}), "batch_size": batch, "train_size": rows}}
    if "max_steps" not in arm["set"]:
        out["max_steps"] = math.ceil(rows / batch)
    return out


def prepare_rows(make_rows: Callable):
    def prepare(exp: Experiment, stage: str, seed: int, settings: dict[str, Any], say: Callable[[str], None]):
        rows, facts = make_rows(exp, stage, seed, say)
        if not rows:
            raise RuntimeError(f"{stage}: none of GRPO's prompts is of question types {exp.arms[stage]['question_types']}; "
                               "there is nothing to fine-tune on (arms.{stage}.question_types)")
        return sft_budget(settings, exp.arms[stage], len(rows)), rows, facts
    return prepare


def prepare_more(exp: Experiment, stage: str, seed: int, settings: dict[str, Any], say: Callable[[str], None]):
    """sft_more: as many steps as cover GRPO's prompt count in SFT rows (fresh rows: stage_settings' data order)."""
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    grpo = load_recipe_config(settings=stage_settings(exp, "grpo", seed))[0]
    extra = grpo.max_steps * grpo.data.batch_size
    if "max_steps" not in exp.arms[stage]["set"]:
        batch = load_recipe_config(settings=settings)[0].data.batch_size
        settings = {**settings, "max_steps": math.ceil(extra / batch)}
    say(f"{stage}: SFT trained on for {extra} more rows, as many as GRPO's prompts")
    return settings, None, {"extra_rows": extra}


PREPARE = {"grpo": None, "answer_sft": prepare_rows(answer_rows), "rft": prepare_rows(sampled_rows),
           "sft_more": prepare_more}


def run_arm(exp: Experiment, stage: str, seed: int, say: Callable[[str], None]) -> None:
    train_stage(exp, stage, seed, say, prepare=PREPARE[exp.arms[stage]["method"]])
