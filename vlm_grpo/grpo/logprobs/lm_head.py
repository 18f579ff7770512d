"""Log-probabilities of given tokens taken straight from the last hidden states, one chunk of positions at a time.

The model's own LM head is applied to a chunk, the chunk is reduced to log p(token) (plus the entropy, with gradient
only when asked for, and whether the token is the argmax) and dropped; in backward the chunk is recomputed (activation
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
    entropy: torch.Tensor  # [B, T] fp32 (zeros unless asked for); a gradient only with entropy_grad
    hits: torch.Tensor  # [B, T] bool: the token is the most likely one (greedy agrees), no gradient
    # a mixture-of-experts model's router load-balancing loss over the forward's tokens (scalar, with gradient);
    # None unless asked for (`router_aux=True`)
    aux_loss: torch.Tensor | None = None


def logit_scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                 entropy_grad: bool = False, with_hits: bool = True):
    """(log p(target), entropy, argmax hit) per row of `logits` [N, V] under softmax(logits / T), in fp32. The
    log-probs carry a gradient; the entropy only with `entropy_grad` (an entropy bonus trains on it, as in TRL;
    otherwise it is a metric or a mask, and its graph would cost a softmax per chunk); hits are all False unless
    `with_hits`."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    norm = torch.logsumexp(logits, dim=-1)
    logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else torch.zeros_like(norm)
    with torch.no_grad():
        hits = logits.argmax(dim=-1) == targets if with_hits else torch.zeros_like(targets, dtype=torch.bool)
    return logps, entropy, hits


def _chunk_scores(head, hidden, targets, temperature: float, softcap: float | None, with_entropy: bool,
                  entropy_grad: bool, with_hits: bool):
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logit_scores(logits, targets, temperature, with_entropy, entropy_grad, with_hits)


def chunked_scores(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                   softcap: float | None = None, with_entropy: bool = False, entropy_grad: bool = False,
                   with_hits: bool = True,
                   chunk_bytes: int = CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log p(target), entropy and argmax hits (False everywhere unless `with_hits`) for hidden states [N, H] and
    targets [N] under softmax(head(h) / T). A plain float32 Linear head takes fused_head.py's path: the same values
    with a few passes over one reused buffer."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = head.weight.shape[0]
    rows = max(1, chunk_bytes // (4 * vocab))
    # the fused backward gives the log-probs a gradient only; an entropy that trains takes the generic path
    if fusable(head, hidden) and not (with_entropy and entropy_grad):
        return fused_scores(head, hidden, targets, temperature=temperature, softcap=softcap, with_entropy=with_entropy,
                            with_hits=with_hits, rows=rows)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, hidden.shape[0], rows):
        args = (head, hidden[start : start + rows], targets[start : start + rows], temperature, softcap, with_entropy,
                entropy_grad, with_hits)
        parts.append(checkpoint(_chunk_scores, *args, use_reentrant=False) if recompute else _chunk_scores(*args))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, empty.bool()
    logps, entropy, hits = (torch.cat(t) for t in zip(*parts))
    return logps, entropy, hits


class ScoringHead(torch.nn.Module):
    """Stands in for the LM head during one forward: scores `targets` at the hidden states it is given."""

    def __init__(self, head: torch.nn.Module, targets: torch.Tensor, softcap: float | None,
                 keep: torch.Tensor | None = None, **options):
        super().__init__()
        self.head, self.targets, self.softcap, self.options = head, targets, softcap, options
        self.keep = keep  # [B, T] bool: the positions to score (None: all); the others' scores are 0
        self.scores: tuple[torch.Tensor, ...] | None = None

    @property
    def weight(self) -> torch.Tensor:  # some model code reads the head's weight (dtype, tying checks)
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows, steps = self.targets.shape
        hidden = hidden[:, -steps - 1 : -1] if hidden.shape[1] > steps else hidden  # positions predicting targets
        hidden, targets = hidden.reshape(rows * steps, -1), self.targets.reshape(-1)
        if self.keep is None or bool(self.keep.all()):  # nothing to leave out: no gather, no scatter
            flat = chunked_scores(self.head, hidden, targets, softcap=self.softcap, **self.options)
        else:  # the head (a vocabulary-wide product per position) runs on the kept positions only
            keep = self.keep.reshape(-1)
            kept = chunked_scores(self.head, hidden[keep], targets[keep], softcap=self.softcap, **self.options)
            flat = tuple(t.new_zeros(rows * steps).masked_scatter(keep, t) for t in kept)
        self.scores = tuple(t.view(rows, steps) for t in flat)
        return hidden.new_zeros(rows, 1, 1)  # the model's "logits": nothing vocabulary-sized


@contextlib.contextmanager
def scoring_head(model: torch.nn.Module, targets: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False,
                 entropy_grad: bool = False, with_hits: bool = True, chunk_bytes: int = CHUNK_BYTES,
                 keep: torch.Tensor | None = None) -> Iterator[ScoringHead]:
    """Within the block, `model`'s LM head scores `targets` [B, T] at the last T+1 hidden positions it sees
    (position t predicts token t) instead of returning logits; read `.scores` after the forward. `keep` [B, T]
    (bool): score only those positions (padding after a completion's end: none of its logits are built); the
    others' scores are 0."""
    core = hf_core(model)
    head = core.get_output_embeddings()
    softcap = getattr(core.config.get_text_config(), "final_logit_softcapping", None)
    scorer = ScoringHead(head, targets, softcap, keep, temperature=temperature, with_entropy=with_entropy,
                          entropy_grad=entropy_grad, with_hits=with_hits, chunk_bytes=chunk_bytes)
    core.set_output_embeddings(scorer)
    try:
        yield scorer
    finally:
        core.set_output_embeddings(head)


def score_completions(adapter, batch, completion_ids: torch.Tensor, completion_mask: torch.Tensor, model=None,
                      inputs=None, router_aux: bool = False, **options) -> TokenScores:
    """TokenScores of a completion from one teacher-forced forward over prompt + completion (logits never built).
    `router_aux`: also the mixture-of-experts load-balancing loss the forward returns (`output_router_logits`)."""
    model = adapter.model if model is None else model
    if inputs is None:
        inputs = adapter.completion_inputs(batch, completion_ids, completion_mask)
    extra = {"output_router_logits": True} if router_aux else {}
    with scoring_head(model, completion_ids, **options) as scorer:
        out = model(**inputs, **extra, logits_to_keep=completion_ids.shape[1] + 1, use_cache=False)
    # a config may declare routers whose model returns no load-balancing loss (Llama 4): then there is none to add
    return TokenScores(*scorer.scores, aux_loss=getattr(out, "aux_loss", None) if router_aux else None)
