"""Checkpoint files a hostile writer could plant: unpickling one runs code (it writes a marker file)."""

from __future__ import annotations

import pickle

import torch


class Payload:
    """Unpickling this runs `exec`, which writes `marker`: what a hostile checkpoint file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def plant(path, marker, form: str) -> None:
    """A malicious file at `path`: a torch.save file (zip) whose pickle calls exec, or a bare pickle."""
    if form == "torch.save":
        torch.save({"state": Payload(marker)}, path)
    else:
        path.write_bytes(pickle.dumps(Payload(marker)))
