"""Before any stage runs: every stage it will run loads its settings as it will when its turn comes (the arms and
each eval report included), and every eval split exists in the questions' recipe. A wrong value in a late stage
then fails in seconds, naming the stage, instead of after the hours the stages before it took."""

from __future__ import annotations

from vlm_grpo.experiment.plan import TRAINING_STAGES, Experiment, ExperimentError
from vlm_grpo.experiment.stages import eval_settings, eval_splits, stage_settings

# the eval report's settings (stages.eval_settings) by the experiment's own keys (its data may be grpo's: named as is)
EVAL_KEYS_OF = {"model.dtype": "eval.dtype", "generation.max_new_tokens": "eval.max_new_tokens"}


def check_experiment(exp: Experiment, stages: tuple[str, ...], seeds: list[int]) -> None:
    """Refuse (ExperimentError naming the file, the stage and the seed) what `stages` would refuse later."""
    from vlm_grpo.grpo.data.recipe_source import heldout_build
    from vlm_grpo.grpo.heldout_eval import heldout_seed
    from vlm_grpo.grpo.setting_fields import SettingError
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    for stage in (*TRAINING_STAGES, *exp.arms):
        if stage not in stages or (stage == "align" and exp.aligns_to_words()):  # words: checked as the file is read
            continue
        for seed in seeds:
            try:
                load_recipe_config(settings=stage_settings(exp, stage, seed))
            except ValueError as err:
                raise ExperimentError(f"{exp.source}: {stage} (seed {seed}): {err}") from None
    if "eval" not in stages:
        return
    # the test splits too, though answered only with --test: a wrong name is found now, not after every seed
    built = set()
    for split, seed in ((split, seed) for split in eval_splits(exp, test=True) for seed in seeds):
        try:
            cfg, recipe = load_recipe_config(settings=eval_settings(exp, "grpo", split, seed))
            questions = (split, heldout_seed(cfg))
            if questions not in built:  # a dataset file is read once per split, not once per seed
                heldout_build(recipe, cfg.data, split, 1, questions[1])
                built.add(questions)
        except SettingError as err:
            key = EVAL_KEYS_OF.get(err.name, err.name)
            raise ExperimentError(f"{exp.source}: eval on split {split!r} (seed {seed}): {key}: {err.problem}") from None
        except ValueError as err:
            raise ExperimentError(f"{exp.source}: eval on split {split!r} (seed {seed}): {err}") from None
