"""Asynchronous rollouts (rollout.max_staleness K > 0): a worker process holding its own copy of the policy samples
the batches of the next K steps while the trainer trains the current one. worker_process.py is the process;
worker_handle.py is the trainer's handle on it (requests, weight versions, results)."""
