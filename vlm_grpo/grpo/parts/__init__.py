"""The parts a stage is built of, one job each, with small public interfaces (grpo/loop/stage.py builds them once):

- `RunContext` (run_context.py): settings, accelerator, the locked run directory, metrics.jsonl, trackers;
- `TrainingData` (training_data.py): the recipe, its rewards and the checked training split, batch by batch;
- `TrainedPolicy` (trained_policy.py): the adapter with LoRA / freeze applied, its optimizer and schedule;
- `Checkpoints` (checkpointing.py): saves, `--resume`, the final model;
- `Evaluation` (evaluation.py): greedy held-out evaluations, before and after a run;
- `Reference` (reference.py): the KL term's reference, decided once (none, LoRA's base, or a frozen copy);
- GRPO's step: `Sampler` (sampler.py) -> `Scoring` (scoring.py) -> `PolicyUpdate` (update.py), with `TokenScorer`
  (token_scorer.py) for log-probs and `StepLog` (step_log.py) for the step's metrics and completions;
- SFT's step: `SupervisedUpdate` (supervised_update.py).
"""
