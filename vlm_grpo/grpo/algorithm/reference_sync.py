"""Moving the KL reference toward the policy (TR-DPO's soft update, TRL's `sync_ref_model`): every
`ref_model_sync_steps` optimizer updates, ref = alpha x policy + (1 - alpha) x ref, parameter by parameter.
A moved reference is part of the run's state: checkpoints keep it (reference.safetensors) so a resumed run continues
from the same reference, not from a fresh copy of the policy."""

from __future__ import annotations

from pathlib import Path

import torch

FILE = "reference.safetensors"


@torch.no_grad()
def mix(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    for ref, new in zip(reference.parameters(), policy.parameters(), strict=True):
        ref.data.mul_(1.0 - alpha).add_(new.data, alpha=alpha)


def save(reference: torch.nn.Module, directory: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in reference.state_dict().items()}, str(Path(directory) / FILE))


def load(reference: torch.nn.Module, checkpoint: Path) -> None:
    from safetensors.torch import load_file

    path = Path(checkpoint) / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} has no {FILE}: it was written by a run without loss.sync_ref_model")
    reference.load_state_dict(load_file(str(path)), strict=True)
