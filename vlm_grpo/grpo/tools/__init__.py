"""Tools for multi-turn rollouts with TRL 1.16's contract: the run's tools and environments (toolset.py), how the
model sees and writes calls (chat_format.py), and running them (calls.py)."""
