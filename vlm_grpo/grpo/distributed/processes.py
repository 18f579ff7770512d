"""What a run's processes share: a decision taken once by the main process, and metrics averaged over all."""

from __future__ import annotations

from typing import Any, Callable

import torch


def on_main(accelerator, decide: Callable[[], Any]) -> Any:
    """`decide()` run by the main process alone (e.g. hashing every file of a checkpoint), its result, or the
    error it raised, shared with every process."""
    if accelerator.num_processes == 1:
        return decide()
    from accelerate.utils import broadcast_object_list

    box: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            box = [(True, decide())]
        except Exception as err:  # noqa: BLE001 - raised below, on every process
            box = [(False, err)]
    broadcast_object_list(box)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def mean_over_processes(accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric's mean over the processes (as they are with one process)."""
    if accelerator.num_processes == 1:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], device=accelerator.device)
    values = accelerator.reduce(values, reduction="mean")
    return dict(zip(keys, values.tolist()))
