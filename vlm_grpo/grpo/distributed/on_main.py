"""Work one process does for all: the main process decides, every process gets the answer (or the error)."""

from __future__ import annotations

from typing import Any, Callable


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
