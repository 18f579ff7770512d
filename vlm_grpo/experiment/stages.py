"""The stages of an experiment, each resumable: a stage that finished (its `stage.json` written) is skipped, a
training stage stopped part-way continues from its newest checkpoint, an evaluation keeps the reports it wrote.

- compose: a random SigLIP tower of the config's shape (when no vision checkpoint is named), pretrained on the
  align stage's task (tower.py) when the config asks, joined to the LM (vlm_grpo/compose.py); written to a
  temporary folder and renamed, so a half-written model is never used;
- align: `vlm-grpo sft` settings, from the composed model (the tower and projector learn; the LM frozen), or with
  `words:` the projector alone learns to put each image token at the LM's words for its cell (words.py);
- sft: from align's final model; grpo: from sft's final model (`vlm-grpo train` settings);
- the arms (arms.py): controls and GRPO variants, each from sft's final model;
- eval: `vlm-grpo eval` on each split for the aligned base, the SFT model, the GRPO model and every arm; the
  validation splits (eval.splits) always, the test splits (eval.test_splits) only when asked (`--test`).

compose and align run once per `base_seed` and are shared by every seed, as a pretrained tower would be, unless
`independent_seeds` gives each seed its own (base-seedN of the seed itself).

Each training stage draws its rows in its own order (data.data_seed, unless the stage sets it): SFT's from the seed,
GRPO's (and the arms that use GRPO's prompts or as many fresh SFT rows) from the seed plus GRPO_ORDER, so GRPO's
prompts are not SFT's own samples again.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from vlm_grpo.experiment.plan import Experiment
from vlm_grpo.grpo import safe_files

DONE = "stage.json"
PREVIOUS = {"align": "compose", "sft": "align", "grpo": "sft"}  # the stage whose output each training stage starts from
GRPO_ORDER = 7001  # GRPO's data order seed is the seed plus this: its prompts are not the SFT rows again (module doc)


def model_stage(model: str) -> str:
    """The stage whose final/ is the evaluated model: the aligned model for "base", else the model's own stage."""
    return "align" if model == "base" else model


def previous_stage(stage: str) -> str:
    return PREVIOUS.get(stage, "sft")  # every arm starts from the SFT checkpoint


def done(path: Path) -> dict[str, Any] | None:
    marker = path / DONE
    return json.loads(marker.read_text()) if marker.is_file() else None


SPENT = "stage-seconds.json"  # wall time of a stage's earlier, stopped runs: a resumed stage's time counts them too


def spent_before(path: Path) -> float:
    marker = path / SPENT
    return float(json.loads(marker.read_text())["seconds"]) if marker.is_file() else 0.0


def record_spent(path: Path, started: float) -> None:
    """Add this run's wall time to the stage's tally (called however the run ends)."""
    path.mkdir(parents=True, exist_ok=True)
    total = spent_before(path) + time.time() - started
    safe_files.write_file(path / SPENT, json.dumps({"seconds": round(total, 1)}))


def mark_done(path: Path, started: float, earlier: float = 0.0, **facts: Any) -> None:
    """Write the stage's stage.json: `earlier` seconds (a finished stage run again: eval) + stopped runs + this run."""
    path.mkdir(parents=True, exist_ok=True)
    seconds = earlier + spent_before(path) + time.time() - started
    safe_files.write_file(path / DONE, json.dumps({"seconds": round(seconds, 1), **facts}, indent=2))


def composed_model(exp: Experiment, seed: int) -> str:
    return f"hybrid:{exp.stage_dir('compose', seed) / 'model'}"


def final_of(exp: Experiment, stage: str, seed: int) -> Path:
    return exp.stage_dir(stage, seed) / "final"


def run_compose(exp: Experiment, seed: int, say: Callable[[str], None]) -> None:
    out = exp.stage_dir("compose", seed)
    if done(out):
        return say(f"compose: done earlier ({out})")
    started = time.time()
    work = out / "partial"
    shutil.rmtree(work, ignore_errors=True)  # a stage cut short left nothing usable: composing takes seconds
    vision, facts, base_seed = exp.compose.get("vision"), {}, exp.base_seed_of(seed)
    if not vision:
        vision = str(random_tower(work / "tower", exp.compose["tower"], base_seed))
        if exp.compose.get("tower_pretrain"):
            from vlm_grpo.experiment.tower import pretrain_tower
            from vlm_grpo.recipes import get_recipe

            task = exp.stages["align"].get("data", {})
            facts = pretrain_tower(work / "tower", get_recipe(task.get("recipe", "scene_count")),
                                   dict(task.get("recipe_options") or {}), seed=base_seed, say=say,
                                   **exp.compose["tower_pretrain"])
    from vlm_grpo.compose import compose

    compose(vision, str(exp.compose["llm"]), str(work / "model"), seed=base_seed)
    shutil.rmtree(out / "model", ignore_errors=True)
    (work / "model").rename(out / "model")
    if (work / "tower").is_dir():
        shutil.rmtree(out / "tower", ignore_errors=True)
        (work / "tower").rename(out / "tower")
    shutil.rmtree(work, ignore_errors=True)
    mark_done(out, started, vision=exp.compose.get("vision") or "random tower", llm=str(exp.compose["llm"]),
              seed=base_seed, **facts)
    say(f"compose: {out / 'model'}")


def random_tower(out: Path, shape: dict[str, Any], seed: int) -> Path:
    """A SigLIP vision tower of `shape` (SiglipVisionConfig's keys), weights from `seed`, with its image processor."""
    import torch
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    try:
        config = SiglipVisionConfig(**shape)
    except TypeError as err:
        raise ValueError(f"compose.tower: {err}") from None
    torch.manual_seed(seed)
    SiglipVisionModel(config).save_pretrained(out)
    size = {"height": config.image_size, "width": config.image_size}
    SiglipImageProcessor(size=size).save_pretrained(out)
    return out


def own_settings(exp: Experiment, stage: str) -> dict[str, Any]:
    """A stage's settings as the file gives them; an arm's: the stage it copies (grpo's for a GRPO variant, sft's for
    the others) with the arm's `set` over it, section by section."""
    from vlm_grpo.grpo.settings.sources import merge_settings

    if stage not in exp.arms:
        return dict(exp.stages[stage])
    arm = exp.arms[stage]
    return merge_settings(exp.stages["grpo" if arm["method"] == "grpo" else "sft"], arm["set"])


def order_seed(exp: Experiment, stage: str, seed: int) -> int | None:
    """The data order seed the experiment gives a stage (None: the stage's seed, the trainer's default): GRPO, its
    variants and sft_more read fresh rows (module doc); the other arms train on rows given to them."""
    if stage == "grpo" or exp.arms.get(stage, {}).get("method") in ("grpo", "sft_more"):
        return seed + GRPO_ORDER
    return None


def stage_settings(exp: Experiment, stage: str, seed: int) -> dict[str, Any]:
    """The stage's settings with what the experiment decides: the model it starts from, its folder, its seed, its data
    order (unless the stage sets data.data_seed), resume."""
    from vlm_grpo.grpo.checkpoint.store import latest_checkpoint

    out = exp.stage_dir(stage, seed)
    start = None if previous_stage(stage) == "compose" else final_of(exp, previous_stage(stage), seed)
    settings = own_settings(exp, stage)
    settings["model"] = {**settings.get("model", {}), "name": composed_model(exp, seed),
                         "init_from": None if start is None else str(start)}
    resume = out.is_dir() and latest_checkpoint(out) is not None
    # a folder without a checkpoint holds only the logs of a start that saved nothing: started again
    settings["logging"] = {**settings.get("logging", {}), "output_dir": str(out), "overwrite_output_dir": not resume}
    settings["seed"] = exp.base_seed_of(seed) if stage == "align" else seed
    settings["resume"] = resume
    order = order_seed(exp, stage, seed)
    if order is not None and (settings.get("data") or {}).get("data_seed") is None:
        settings["data"] = {**settings.get("data", {}), "data_seed": order}
    return settings


def require_previous(exp: Experiment, stage: str, seed: int) -> None:
    previous = previous_stage(stage)
    if not done(exp.stage_dir(previous, seed)):
        raise RuntimeError(f"{stage} starts from the {previous} stage, which has not finished ({exp.stage_dir(previous, seed)}); "
                           f"run it first (--stages {previous},{stage})")


def train_stage(exp: Experiment, stage: str, seed: int, say: Callable[[str], None], prepare: Callable | None = None) -> None:
    """One training stage: `vlm-grpo train` for GRPO and its variants, `vlm-grpo sft` for the others. `prepare(exp,
    stage, seed, settings, say)`, for an arm trained on rows it is given, returns (settings, rows or None, facts): the
    rows replace the recipe's training split, the facts go into stage.json."""
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    out = exp.stage_dir(stage, seed)
    if done(out):
        changed = changed_since(out, ran_with(exp, stage))
        if changed:
            raise RuntimeError(f"{stage} finished in {out} with other settings than the config gives it now: "
                               f"{'; '.join(changed)}. Its model is not what the config describes: move {out} aside "
                               "to train it again with these settings, or restore the config's values")
        return say(f"{stage}: done earlier ({out})")
    require_previous(exp, stage, seed)
    settings = stage_settings(exp, stage, seed)
    started, facts = time.time(), {}
    grpo = stage == "grpo" or exp.arms.get(stage, {}).get("method") == "grpo"
    try:
        rows = None
        if prepare is not None:
            settings, rows, facts = prepare(exp, stage, seed, settings, say)
        cfg, recipe = load_recipe_config(settings=settings)
        if rows is not None:
            recipe = with_rows(recipe, rows)
        if grpo:
            from vlm_grpo.api.trainers import GRPOTrainer as Trainer
        else:
            from vlm_grpo.api.trainers import SFTTrainer as Trainer
        say(f"{stage}: {cfg.max_steps} steps into {out}" + (" (resumed)" if settings["resume"] else ""))
        trainer = Trainer.from_settings(cfg, recipe=recipe, resume_hint=RESUME_HINT)
        trainer.train()
    except BaseException:
        record_spent(out, started)  # a stopped run's time counts toward the stage's when it resumes
        raise
    history = trainer.ctx.log_history  # the run's steps, those before a resume included
    complete = bool(history) and history[-1]["step"] == cfg.max_steps and final_of(exp, stage, seed).is_dir()
    if not complete:
        raise RuntimeError(f"{stage} stopped before its last step ({out}); run the command again to resume it")
    safe_files.write_file(out / RAN_WITH, json.dumps(ran_with(exp, stage), indent=1, default=str) + "\n")
    mark_done(out, started, steps=cfg.max_steps, resumed=settings["resume"], **facts)


RESUME_HINT = "running this vlm-grpo experiment command again"  # a stage resumes by itself: it has no --resume
RAN_WITH = "stage-settings.json"  # a finished stage's settings as the config gave them (ran_with)
LENGTH = ("max_steps", "epochs")  # honoured by a resume, but a finished stage of another length is another model


def ran_with(exp: Experiment, stage: str) -> dict[str, Any]:
    """What the config says of a stage: its settings (own_settings) and, for an arm, its method and options."""
    arm = {k: v for k, v in exp.arms.get(stage, {}).items() if k != "set"}
    return {**own_settings(exp, stage), **({"arm": arm} if arm else {})}


def changed_since(out: Path, settings: dict[str, Any]) -> list[str]:
    """The settings that differ, in what the run means, between those the config gave a finished stage (RAN_WITH)
    and those it gives now (`settings`, ran_with), each as "key was -> now"; a value set on one side only counts.
    Settings whose change a resumed run honours (logging, evaluation, performance switches) do not count; the
    length (LENGTH) does. A stage that finished before the record was kept is not checked."""
    from vlm_grpo.grpo.checkpoint.resume_rules import flat
    from vlm_grpo.grpo.setting_fields import resume_policies
    from vlm_grpo.grpo.settings.sections import TrainConfig

    record = out / RAN_WITH
    if not record.is_file():
        return []
    was = flat(json.loads(record.read_text()))
    now = flat(json.loads(json.dumps(settings, default=str)))
    policies = resume_policies(TrainConfig())
    unset = "(not set)"
    return [f"{key} {was.get(key, unset)!r} -> {now.get(key, unset)!r}" for key in sorted(set(was) | set(now))
            if was.get(key, unset) != now.get(key, unset)
            and (key in LENGTH or policies.get(key, "refused") in ("refused", "fixed"))]


def with_rows(recipe, rows: list):
    """The recipe with `rows` as its training split (its other splits as they were)."""
    from dataclasses import replace

    def build(split: str = "train", size: int = 0, seed: int = 0, **options):
        return list(rows) if split == "train" else recipe.build(split=split, size=size, seed=seed, **options)

    return replace(recipe, build=build)


def run_training(stage: str) -> Callable[[Experiment, int, Callable[[str], None]], None]:
    def run(exp: Experiment, seed: int, say: Callable[[str], None]) -> None:
        train_stage(exp, stage, seed, say)
    return run


def eval_task(exp: Experiment) -> dict[str, Any]:
    """The questions every model is asked: eval.data where the config names it, else the GRPO stage's task (the last
    one trained; SFT may have seen only part of it)."""
    task = exp.eval.get("data") or exp.stages["grpo"].get("data", {})
    return {"recipe": task.get("recipe"), "recipe_options": dict(task.get("recipe_options") or {})}


def eval_settings(exp: Experiment, model: str, split: str, seed: int) -> dict[str, Any]:
    """`vlm-grpo eval` settings of one report: the task of eval_task, the experiment's eval section."""
    ev = exp.eval  # values as written: the settings' own checks name a wrong one (bool("false") would be True)
    return {
        "model": {"name": composed_model(exp, seed), "init_from": str(final_of(exp, model_stage(model), seed)),
                  "dtype": ev.get("dtype", "auto")},
        "data": eval_task(exp),
        "generation": {"max_new_tokens": ev.get("max_new_tokens", 64)},
        "eval": {"split": split, "size": ev.get("size", 200), "eval_batch_size": ev.get("eval_batch_size", 32),
                 "data_seed": ev.get("data_seed", 0), "image_reliance": ev.get("image_reliance", True)},
        "seed": seed,
    }


def report_path(exp: Experiment, model: str, split: str, seed: int) -> Path:
    # the base model is its base seed's: evaluated once, beside it
    folder = exp.base_dir(seed) / "eval" if model == "base" else exp.seed_dir(seed) / "eval"
    return folder / f"{model}-{split}.json"


def eval_splits(exp: Experiment, test: bool = False) -> list[str]:
    """The validation splits (eval.splits), and the test splits (eval.test_splits) when `test`: the final table's."""
    return [*exp.eval.get("splits", ["test"]), *(exp.eval.get("test_splits", []) if test else [])]


def run_eval(exp: Experiment, seed: int, say: Callable[[str], None], test: bool = False) -> None:
    """Every model's report on each split (eval_splits); a report written earlier is kept, never asked again: a test
    split is answered once. A model whose stage has not finished waits: the others are answered first, then the
    run stops naming it, so the same command later answers only what is left."""
    from vlm_grpo.grpo.heldout_eval import evaluate_run, write_report
    from vlm_grpo.grpo.settings.sources import load_recipe_config
    from vlm_grpo.grpo.training.policy import load_policy

    started, answering = time.time(), {}
    waiting = [model for model in exp.models() if not done(exp.stage_dir(model_stage(model), seed))]
    for model in exp.models():
        if model in waiting:
            continue
        splits = [s for s in eval_splits(exp, test) if not report_path(exp, model, s, seed).is_file()]
        if not splits:
            continue
        policy = None
        for split in splits:
            cfg, recipe = load_recipe_config(settings=eval_settings(exp, model, split, seed))
            if policy is None:  # one load per model, for all its splits
                policy = load_policy(cfg)
            split_started = time.time()
            report = evaluate_run(policy, recipe, cfg)
            answering[split] = answering.get(split, 0.0) + time.time() - split_started
            report["model"] = cfg.model.init_from
            write_report(report, report_path(exp, model, split, seed))
            say(f"eval: {model} on {split}: accuracy {report['accuracy']:.3f} +/- {report['accuracy_se']:.3f}")
    add_eval_time(exp.seed_dir(seed) / "eval", started, answering)
    if waiting:
        stages = ",".join(model_stage(model) for model in waiting)
        raise RuntimeError(f"eval of seed {seed}: the finished models are answered; these stages have not finished: "
                           f"{stages}; run them (--stages {stages}), then eval again")


def add_eval_time(path: Path, started: float, answering: dict[str, float]) -> None:
    """Eval runs more than once (the validation splits, later the test splits, or again with nothing left to answer):
    each run adds its wall time, and each split its answering time, to what the earlier runs recorded."""
    before = done(path) or {}
    splits = dict(before.get("seconds_by_split", {}))
    for split, seconds in answering.items():
        splits[split] = round(splits.get(split, 0.0) + seconds, 1)
    mark_done(path, started, earlier=float(before.get("seconds", 0.0)), seconds_by_split=splits)


def run_word_align(exp: Experiment, seed: int, say: Callable[[str], None]) -> None:
    """The align stage's `words` method: the composed model's projector trained to the LM's words (words.py), saved
    as the stage's final/ (written aside and renamed, so a half-written model is never used)."""
    from vlm_grpo.experiment.words import align_to_words
    from vlm_grpo.recipes import get_recipe

    out = exp.stage_dir("align", seed)
    if done(out):
        return say(f"align: done earlier ({out})")
    require_previous(exp, "align", seed)
    started, work = time.time(), out / "partial"
    shutil.rmtree(work, ignore_errors=True)
    settings = exp.stages["align"]
    task = settings.get("data", {})
    facts = align_to_words(exp.stage_dir("compose", seed) / "model", work, get_recipe(task.get("recipe", "scene_count")),
                           dict(task.get("recipe_options") or {}), seed=exp.base_seed_of(seed), say=say, **settings["words"])
    shutil.rmtree(final_of(exp, "align", seed), ignore_errors=True)
    work.rename(final_of(exp, "align", seed))
    mark_done(out, started, method="words", steps=settings["words"]["steps"], **facts)


def run_align(exp: Experiment, seed: int, say: Callable[[str], None]) -> None:
    runner = run_word_align if exp.aligns_to_words() else run_training("align")
    runner(exp, seed, say)
