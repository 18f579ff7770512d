"""Padding-free completion passes: each prompt's completions laid end to end instead of one padded row each.

After the prompt pass (prompt_cache.py) every completion row continues its prompt's KV cache. Padded, a row is as
long as the longest completion of the micro-batch, and every position past a completion's end still runs through
every layer and the LM head. Packed, the completions of one prompt fill rows of that same width end to end
(first-fit decreasing), so the pass runs over fewer rows; each packed row continues its prompt's cache. Each token
keeps the position it has in the padded layout (3-D M-RoPE and every family's own position rule carry over as they
are), and a 4-D mask lets it see its prompt and its own completion's earlier tokens only.

Rows are packed within a prompt and never wider than the padded row: the mask is dense, so attention over one row
costs its length squared, and one row for a whole micro-batch would cost more than the padding it removes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# `auto` packs when the rows fall by at least this share: the pass's time falls with its rows (on the default run's
# model, 37% fewer rows made forward + backward 1.39x faster: benchmarks/packed_forward.py), and below a tenth the
# saving is within the noise of timing it
AUTO_MIN_SAVING = 0.1


@dataclass
class PackedRows:
    """Where each slot of the packed rows comes from: completion row `row[b, j]`, its token `step[b, j]` (fed to
    predict token step + 1); `valid` False for the slots after a packed row's last completion."""

    cache_rows: list[int]  # per packed row: the completion row whose prompt's cache it continues
    row: torch.Tensor  # [B, W] long
    step: torch.Tensor  # [B, W] long
    valid: torch.Tensor  # [B, W] bool

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.row.shape)


def fed_lengths(completion_mask: torch.Tensor) -> list[int]:
    """Tokens each completion feeds the completion pass: all but its last (which predicts nothing kept)."""
    return [max(0, n - 1) for n in completion_mask.sum(dim=1).tolist()]


def is_right_padded(completion_mask: torch.Tensor) -> bool:
    """Every row's mask is ones then zeros (a hole inside a completion would need its own layout)."""
    mask = completion_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def pack_rows(lengths: list[int], groups: list[int]) -> list[list[int]]:
    """Rows (lists of completion indices, in the order they sit) filled end to end: completions of the same group
    only, first-fit decreasing into rows as wide as the longest completion. Zero-length completions take no slot."""
    width = max(lengths, default=0)
    bins: list[list[int]] = []
    for group in dict.fromkeys(groups):
        members = sorted((k for k, g in enumerate(groups) if g == group and lengths[k] > 0), key=lambda k: -lengths[k])
        open_bins: list[tuple[int, list[int]]] = []  # (space left, rows)
        for k in members:
            for i, (left, rows) in enumerate(open_bins):
                if lengths[k] <= left:
                    rows.append(k)
                    open_bins[i] = (left - lengths[k], rows)
                    break
            else:
                open_bins.append((width - lengths[k], [k]))
        bins.extend(rows for _, rows in open_bins)
    return bins


def plan(lengths: list[int], groups: list[int], device: torch.device) -> PackedRows:
    """The slot layout of `pack_rows`."""
    bins = pack_rows(lengths, groups)
    width = max(lengths, default=0)
    row = torch.full((len(bins), width), -1, dtype=torch.long)
    step = torch.zeros((len(bins), width), dtype=torch.long)
    for b, members in enumerate(bins):
        at = 0
        for k in members:
            row[b, at:at + lengths[k]] = k
            step[b, at:at + lengths[k]] = torch.arange(lengths[k])
            at += lengths[k]
    return PackedRows([members[0] for members in bins], row.to(device), step.to(device), (row >= 0).to(device))


def worth_packing(lengths: list[int], groups: list[int], mode: str) -> bool:
    """Whether to pack: `on` whenever it removes a row, `auto` when it removes AUTO_MIN_SAVING of them, `off` never."""
    return pays(len(pack_rows(lengths, groups)), lengths, mode)


def pays(packed_rows: int, lengths: list[int], mode: str) -> bool:
    """worth_packing's rule for a packing already laid out into `packed_rows` rows."""
    if mode == "off" or not any(lengths):
        return False
    padded = sum(1 for n in lengths if n > 0)
    return packed_rows < padded if mode == "on" else packed_rows <= (1 - AUTO_MIN_SAVING) * padded


def gather_slots(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """values[..., R, T] -> [..., B, W] at each slot's (row, step); pad slots read row 0, step 0."""
    return values[..., packed.row.clamp(min=0), packed.step]


def attention_mask(packed: PackedRows, prompt_mask: torch.Tensor, implementation: str) -> torch.Tensor:
    """[B, 1, W, L + W]: a slot sees its prompt's unpadded positions (`prompt_mask` [B, L], per packed row) and the
    earlier slots of its own completion; a pad slot sees itself only (a row that sees nothing would give NaN).
    Booleans for SDPA; for eager attention, 0 where seen and the dtype's minimum elsewhere (added to the scores)."""
    row, valid = packed.row, packed.valid
    width = row.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=row.device).tril()
    same = (row.unsqueeze(2) == row.unsqueeze(1)) & valid.unsqueeze(2) & causal
    same |= torch.eye(width, dtype=torch.bool, device=row.device) & ~valid.unsqueeze(2)
    prompt = prompt_mask.bool().unsqueeze(1) & valid.unsqueeze(2)
    seen = torch.cat([prompt, same], dim=2).unsqueeze(1)
    if implementation == "eager":
        return torch.zeros(seen.shape, dtype=torch.float32, device=row.device).masked_fill(
            ~seen, torch.finfo(torch.float32).min)
    return seen


def unpack(scores: torch.Tensor, packed: PackedRows, rows: int, steps: int) -> torch.Tensor:
    """Packed per-slot values [B, W] -> [rows, steps] at (row, step) of each valid slot, zeros elsewhere;
    differentiable in `scores`."""
    out = scores.new_zeros(rows, steps)
    return out.index_put((packed.row[packed.valid], packed.step[packed.valid]), scores[packed.valid])
