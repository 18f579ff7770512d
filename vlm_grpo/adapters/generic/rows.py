"""Which rows of each processor tensor belong to which sample, learned from the processor itself.

The batch is encoded once; each sample with images is encoded again alone. A tensor whose rows are the samples'
own rows one after another (flat patches, per-image tiles) splits by those counts; a tensor with one row per
sample (images padded per sample) splits one row each; a tensor of one row whose last dimension holds the samples'
own columns one after another (MiniCPM-V's packed patches: [1, C, P, sum of L]) is kept with that dimension first,
one row per column, and splits by those counts (`packed`: the adapter moves it back for the model). A tensor that is
none of these cannot be regrouped for a GRPO group, and the model type is refused naming it.
"""

from __future__ import annotations

import torch

from vlm_grpo.adapters.generic.support import GenericUnsupported


def alone_rows(adapter, texts: list[str], images: list[list], keys: list[str]) -> list[dict[str, int]]:
    """Rows of each tensor in `keys` when each sample is encoded alone (a sample without images has none)."""
    rows = []
    for text, sample in zip(texts, images):
        if not sample:
            rows.append({})
            continue
        rows.append(tensor_rows(adapter._process([text], [sample]), keys))
    return rows


def tensor_rows(features, keys: list[str]) -> dict[str, int]:
    """Rows of each tensor in `keys`, and (as `KEY:cols`) the size of its last dimension."""
    tensors = {k: features[k] for k in keys if isinstance(features.get(k), torch.Tensor)}
    return {**{k: int(v.shape[0]) for k, v in tensors.items()},
            **{f"{k}:cols": int(v.shape[-1]) for k, v in tensors.items() if v.dim() > 1}}


def sample_rows(model_type: str, tensors: dict[str, torch.Tensor], alone: list[dict[str, int]],
                packed: set[str]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """(the tensors, each sample's rows of them). A tensor padded per sample keeps only the rows of samples with
    images: a sample without any owns none (a model given an all-padding image row may not cope). Keys found packed
    along the last dimension are added to `packed` (and stay packed for later batches, one sample ones included)."""
    samples = len(alone)
    kept, rows = {}, {}
    for key, tensor in tensors.items():
        total = int(tensor.shape[0]) if tensor.dim() else 0
        concatenated = [a.get(key, 0) for a in alone]
        columns = [a.get(f"{key}:cols", 0) for a in alone]
        if total == 1 and tensor.dim() > 1 and sum(columns) == tensor.shape[-1] and (
                key in packed or (samples > 1 and sum(concatenated) != total)):
            packed.add(key)
            kept[key], rows[key] = tensor.movedim(-1, 0), columns
        elif sum(concatenated) == total:
            kept[key], rows[key] = tensor, concatenated
        elif total == samples:
            owners = [i for i in range(samples) if alone[i]]
            kept[key] = tensor if len(owners) == samples else tensor[torch.tensor(owners, dtype=torch.long)]
            rows[key] = [1 if alone[i] else 0 for i in range(samples)]
        else:
            raise GenericUnsupported(
                f"{model_type}: the processor's {key!r} has {total} rows for {samples} samples, neither the samples' "
                f"own rows ({concatenated}) nor one per sample; it cannot be regrouped per prompt"
            )
    return kept, rows
