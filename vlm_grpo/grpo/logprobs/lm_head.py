"""Log-probabilities of given tokens taken straight from the last hidden states, one chunk of positions at a time.

The model's own LM head is applied to a chunk, the chunk is reduced to log p(token) (plus entropy and whether
the token is the argmax, both without gradient) and dropped; in backward the chunk is recomputed (activation
checkpointing). So no [rows, T, vocab] logits tensor exists in the forward or in the backward: with a 152k
vocabulary that tensor is 2.5 GB in bf16 at 8 rows x 1024 tokens, and its fp32 gradient twice that. A plain
float32 Linear head (outside autocast) takes fused_head.py's path: the same chunks through one reused buffer and a
hand-written backward, a few passes over each chunk instead of autograd's dozen; any other head (wrapped,
quantized, lower precision) takes the generic path here.

`scoring_head` puts this in place of the LM head for one forward of the (possibly wrapped) model, so the
model's forward (and DDP/FSDP's hooks around it) runs as usual and only the head's output changes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from vlm_grpo.adapters.features import hf_core
from vlm_grpo.grpo.logprobs.fused_head import fusable, fused_scores

CHUNK_BYTES = 256 * 2**20  # fp32 logits of one chunk


@dataclass
class TokenScores:
    logps: torch.Tensor  # [B, T] fp32, carries the gradient
    entropy: torch.Tensor  # [B, T] fp32, no gradient (zeros unless asked for)
    hits: torch.Tensor  # [B, T] bool: the token is the most likely one (greedy agrees), no gradient


def logit_scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                 with_hits: bool = True):
    """(log p(target), entropy, argmax hit) per row of `logits` [N, V] under softmax(logits / T), in fp32; only
    the log-probs carry a gradient."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    norm = torch.logsumexp(logits, dim=-1)
    logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
    with torch.no_grad():
        entropy = norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else torch.zeros_like(norm)
        hits = logits.argmax(dim=-1) == targets if with_hits else torch.zeros_like(targets, dtype=torch.bool)
    return logps, entropy, hits


def _chunk_scores(head, hidden, targets, temperature: float, softcap: float | None, with_entropy: bool, with_hits: bool):
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logit_scores(logits, targets, temperature, with_entropy, with_hits)


def chunked_scores(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                   softcap: float | None = None, with_entropy: bool = False, with_hits: bool = True,
                   chunk_bytes: int = CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log p(target), entropy and argmax hits (False everywhere unless `with_hits`) for hidden states [N, H] and
    targets [N] under softmax(head(h) / T). A plain float32 Linear head takes fused_head.py's path: the same values
    with a few passes over one reused buffer."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = head.weight.shape[0]
    rows = max(1, chunk_bytes // (4 * vocab))
    if fusable(head, hidden):
        return fused_scores(head, hidden, targets, temperature=temperature, softcap=softcap, with_entropy=with_entropy,
                            with_hits=with_hits, rows=rows)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, hidden.shape[0], rows):
        args = (head, hidden[start : start + rows], targets[start : start + rows], temperature, softcap, with_entropy,
                with_hits)
        parts.append(checkpoint(_chunk_scores, *args, use_reentrant=False) if recompute else _chunk_scores(*args))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, empty.bool()
    logps, entropy, hits = (torch.cat(t) for t in zip(*parts))
    return logps, entropy, hits


class _ScoringHead(torch.nn.Module):
    """Stands in for the LM head during one forward: scores `targets` at the hidden states it is given."""

    def __init__(self, head: torch.nn.Module, targets: torch.Tensor, softcap: float | None, **options):
        super().__init__()
        self.head, self.targets, self.softcap, self.options = head, targets, softcap, options
        self.scores: tuple[torch.Tensor, ...] | None = None

    @property
    def weight(self) -> torch.Tensor:  # some model code reads the head's weight (dtype, tying checks)
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows, steps = self.targets.shape
        hidden = hidden[:, -steps - 1 : -1] if hidden.shape[1] > steps else hidden  # positions predicting targets
        flat = chunked_scores(self.head, hidden.reshape(rows * steps, -1), self.targets.reshape(-1),
                              softcap=self.softcap, **self.options)
        self.scores = tuple(t.view(rows, steps) for t in flat)
        return hidden.new_zeros(rows, 1, 1)  # the model's "logits": nothing vocabulary-sized


@contextlib.contextmanager
def scoring_head(model: torch.nn.Module, targets: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                 with_hits: bool = True, chunk_bytes: int = CHUNK_BYTES) -> Iterator[_ScoringHead]:
    """Within the block, `model`'s LM head scores `targets` [B, T] at the last T+1 hidden positions it sees
    (position t predicts token t) instead of returning logits; read `.scores` after the forward."""
    core = hf_core(model)
    head = core.get_output_embeddings()
    softcap = getattr(core.config.get_text_config(), "final_logit_softcapping", None)
    scorer = _ScoringHead(head, targets, softcap, temperature=temperature, with_entropy=with_entropy,
                          with_hits=with_hits, chunk_bytes=chunk_bytes)
    core.set_output_embeddings(scorer)
    try:
        yield scorer
    finally:
        core.set_output_embeddings(head)


def score_completions(adapter, batch, completion_ids: torch.Tensor, completion_mask: torch.Tensor, model=None,
                      inputs=None, **options) -> TokenScores:
    """TokenScores of a completion from one teacher-forced forward over prompt + completion (logits never built)."""
    model = adapter.model if model is None else model
    if inputs is None:
        inputs = adapter.completion_inputs(batch, completion_ids, completion_mask)
    with scoring_head(model, completion_ids, **options) as scorer:
        model(**inputs, logits_to_keep=completion_ids.shape[1] + 1, use_cache=False)
    return TokenScores(*scorer.scores)
