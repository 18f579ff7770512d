"""The loop GRPO and SFT share, and its one builder: a stage's parts built once, in one pass, from validated settings
(stage.py, with the step loop in `train()`), GRPO's step parts and step (grpo_stage.py), SFT's (sft_stage.py). The
Python API (api/) builds a stage from TRL's arguments and exposes TRL's trainer surface over it."""
