"""What watches a run's steps: one Guard protocol and the Guards that run them (protocol.py); the watchdogs every stage's
loop runs over each step's metrics (watchdogs.py); the reward-hacking and grounding monitors (hacking_monitors.py) and
the statistics they judge (hacking_watch.py, image_reliance.py); the check of the weights after every update
(weight_guard.py)."""
