"""What a run's processes share: a decision taken once by the main process, and metrics averaged over all (a
`.../min` or `.../max` statistic taken over all, as TRL gathers them)."""

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


def extremes_over_processes(accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Metrics named `.../min` or `.../max` as the minimum or maximum over the processes (the others as they are);
    a mean over processes then leaves them as they are."""
    if accelerator.num_processes == 1:
        return metrics
    out = dict(metrics)
    for suffix, sign in (("/min", -1.0), ("/max", 1.0)):
        keys = sorted(k for k in metrics if k.endswith(suffix))
        if keys:  # the maximum of the values, or of the negated values for a minimum
            values = torch.tensor([[sign * float(metrics[k]) for k in keys]], device=accelerator.device)
            largest = accelerator.gather(values).max(dim=0).values
            out.update({k: sign * v for k, v in zip(keys, largest.tolist())})
    return out
