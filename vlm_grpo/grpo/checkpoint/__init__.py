"""What a checkpoint is on disk and what may resume from it: the atomic save, load and rotation (store.py), every
file's size and sha256 (manifest.py), run_state.json and trainer_state.json checked against their schema
(run_state.py), what a resumed run may change (resume_rules.py), and a sharded (FSDP) run's shards (sharded.py).
The trainer's part that uses them is grpo/parts/checkpointing.py."""
