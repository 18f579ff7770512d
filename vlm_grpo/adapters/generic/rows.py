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
        alone = adapter._process([text], [sample])
        values = {f"{k}:values": alone[k] for k in keys if isinstance(alone.get(k), torch.Tensor)
                  and _is_index(alone[k])}  # integer tensors: indices may need rebasing (below)
        rows.append({**tensor_rows(alone, keys), **values})
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


# ---------------------------------------------------------------- indices into another tensor's rows (Molmo 2)
def localize_indices(tensors: dict[str, torch.Tensor], rows: dict[str, list[int]], alone: list[dict],
                     found: dict[str, tuple[str, int]]) -> dict[str, torch.Tensor]:
    """`tensors` with every index tensor that points into another tensor's rows, counted over the whole batch
    (Molmo 2's `image_token_pooling`: sample i's indices are offset by the patches of the samples before it), held
    as each sample alone has it; `found` (key -> (target key, index units per target row)) learns such keys, and
    `rebase_indices` puts the offsets back for whatever samples a later batch holds."""
    out = dict(tensors)
    for key, tensor in tensors.items():
        if not _is_index(tensor) or key not in rows or len(rows[key]) != len(alone):
            continue
        offsets = _offsets(torch.split(tensor, rows[key]), [a.get(f"{key}:values") for a in alone])
        if offsets is None or not any(offsets):
            continue
        target = found.get(key) or _target(key, offsets, tensors, rows)
        if target is None:
            continue
        found[key] = target
        shift = torch.tensor(offsets, dtype=tensor.dtype).repeat_interleave(torch.tensor(rows[key]))
        shift = shift.view(-1, *[1] * (tensor.dim() - 1))
        out[key] = torch.where(tensor >= 0, tensor - shift, tensor)
    return out


def _is_index(tensor: torch.Tensor) -> bool:
    """Integer tensors can index; floats (pixels) and booleans (masks) cannot."""
    return not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool


def _offsets(parts, alone_values) -> list[int] | None:
    """Per sample, the constant by which its batch indices exceed its alone ones (None: not an offset index)."""
    offsets = []
    for part, values in zip(parts, alone_values):
        if values is None or part.numel() == 0:
            offsets.append(0)
            continue
        if tuple(values.shape) != tuple(part.shape):
            return None
        valid = values >= 0
        diff = (part - values)[valid]
        if not torch.equal(part[~valid], values[~valid]) or (diff.numel() and not bool((diff == diff[0]).all())):
            return None
        offsets.append(int(diff[0]) if diff.numel() else 0)
    return offsets


def _target(key, offsets, tensors, rows) -> tuple[str, int] | None:
    """The tensor whose rows (times a per-row unit) the offsets count, and that unit."""
    for other, tensor in tensors.items():
        if other == key or not tensor.is_floating_point() or other not in rows or len(rows[other]) != len(offsets):
            continue
        before = [sum(rows[other][:i]) for i in range(len(offsets))]
        first = next((i for i, o in enumerate(offsets) if o), None)
        if first is None or not before[first] or offsets[first] % before[first]:
            continue
        unit = offsets[first] // before[first]
        if all(o == unit * b for o, b in zip(offsets, before) if o or b):
            return other, unit
    return None


def rebase_indices(inputs: dict[str, torch.Tensor], rows: dict[str, list[int]],
                   found: dict[str, tuple[str, int]]) -> dict[str, torch.Tensor]:
    """Index tensors held per sample (localize_indices) offset again by the target rows of the samples before."""
    for key, (target, unit) in found.items():
        if key not in inputs or target not in rows or key not in rows:
            continue
        before = torch.tensor([0] + rows[target][:-1]).cumsum(0) * unit
        shift = before.to(inputs[key].dtype).repeat_interleave(torch.tensor(rows[key]))
        shift = shift.view(-1, *[1] * (inputs[key].dim() - 1)).to(inputs[key].device)
        inputs[key] = torch.where(inputs[key] >= 0, inputs[key] + shift, inputs[key])
    return inputs
