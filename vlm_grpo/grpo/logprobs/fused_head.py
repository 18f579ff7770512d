"""The LM head and the log-softmax of the chosen tokens as one autograd function, over one reused buffer.

At a 151,936-id vocabulary, the work around the head's matrix products costs as much as the products: every
elementwise operation on a chunk's logits is a pass over rows x 152k floats, and autograd's log-softmax takes a
dozen of them per chunk (log-sum-exp, the gather, the entropy's softmax, the argmax, and in backward the recomputed
forward, softmax, a zero-filled gather gradient and their sum). Each of those allocates a fresh chunk-sized tensor,
which on a CPU is fresh pages from the kernel. Here a chunk's logits are written into one buffer that serves every
chunk, forward and backward, and are reduced in place:

- forward: logits -> (softcap) -> / temperature -> max, the chosen token's logit, exp(x - max) and its sum: log p,
  the entropy (one more pass, when asked) and the argmax hit (only where the chosen token attains the maximum);
  kept for backward: the hidden states and each row's log-sum-exp, nothing vocabulary-sized;
- backward: logits recomputed into the buffer, turned in place into d log p / d logits = g (onehot - softmax), then
  the two products (hidden-state and weight gradients). A frozen head (LoRA) needs neither: its forward takes
  E_p[W] (one product with the probabilities it holds), and backward is g (W[target] - E_p[W]) / T.

It serves a plain `torch.nn.Linear` head outside autocast, in float32 or with weights stored in bf16/fp16
(training/precision.py): there the products run in the weights' dtype through a second buffer of that dtype, and
every reduction in float32, as the generic path rounds them. Anything else (a wrapped or quantized head, autocast)
takes the generic path of lm_head.py.
"""

from __future__ import annotations

import torch


def fusable(head: torch.nn.Module, hidden: torch.Tensor) -> bool:
    """Whether `fused_scores` can stand in for the generic path for this head and these hidden states."""
    return (
        type(head) is torch.nn.Linear
        and head.weight.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and hidden.dtype == head.weight.dtype
        and not torch.is_autocast_enabled(hidden.device.type)
        and type(head.weight) in (torch.Tensor, torch.nn.Parameter)  # not a DTensor or a quantized weight
    )


def _low_buffer(buffer: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """A buffer of the weight's dtype beside the float32 one, for the products of a bf16/fp16 head (None: float32)."""
    return None if weight.dtype == buffer.dtype else buffer.new_empty(buffer.shape, dtype=weight.dtype)


def _logits_into(out: torch.Tensor, hidden, weight, bias, temperature: float, softcap: float | None,
                 low: torch.Tensor | None = None) -> torch.Tensor:
    """out (float32) <- softcap(hidden @ weight.T + bias) / temperature, in place (the rounding of the generic path:
    a bf16/fp16 head's product in its dtype, in `low`, then upcast)."""
    product = out if low is None else low[: out.shape[0]]
    if bias is None:
        torch.mm(hidden, weight.t(), out=product)
    else:
        torch.addmm(bias, hidden, weight.t(), out=product)
    if low is not None:
        out.copy_(product)
    if softcap:
        out.div_(softcap).tanh_().mul_(softcap)
    if temperature != 1.0:
        out.div_(temperature)
    return out


class _FusedHeadScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, softcap, with_entropy, with_hits, rows):
        count, vocab = hidden.shape[0], weight.shape[0]
        f32 = dict(dtype=torch.float32)
        logps = hidden.new_empty(count, **f32)
        lse = hidden.new_empty(count, **f32)
        entropy = hidden.new_zeros(count, **f32)
        hits = torch.zeros(count, dtype=torch.bool, device=hidden.device)
        buffer = hidden.new_empty(min(rows, count), vocab, **f32)
        low = _low_buffer(buffer, weight)
        weights = hidden.new_empty(buffer.shape, **f32) if with_entropy else None
        # A frozen head (LoRA, a frozen LM head) needs only d log p(t) / d h = (W[t] - E_p[W]) / T in backward, and
        # the forward holds p: one product with it here instead of recomputing the logits there.
        direct = ctx.needs_input_grad[0] and not any(ctx.needs_input_grad[1:3]) and not softcap
        expected = hidden.new_empty(count, hidden.shape[1], **f32) if direct else None
        for start in range(0, count, rows):
            end = min(count, start + rows)
            x = _logits_into(buffer[: end - start], hidden[start:end], weight, bias, temperature, softcap, low)
            top = x.amax(dim=-1)
            picked = x.gather(1, targets[start:end, None]).squeeze(1)
            if with_hits:
                hit = picked == top
                rows_hit = hit.nonzero().squeeze(1)
                if rows_hit.numel():  # the first maximum decides, as argmax does
                    hit[rows_hit] = x[rows_hit].argmax(-1) == targets[start:end][rows_hit]
                hits[start:end] = hit
            x.sub_(top[:, None])
            if with_entropy:
                e = torch.exp(x, out=weights[: end - start])
                total = e.sum(-1)
                # entropy = log total - E_p[x - top], with E_p[x - top] = (e . (x - top)) / total
                dot = torch.bmm(e.unsqueeze(1), x.unsqueeze(2)).view(-1)
                entropy[start:end] = total.log() - dot / total
            else:
                e = x.exp_()
                total = e.sum(-1)
            if direct:  # E_p[W] = (e @ W) / total
                if low is None:
                    torch.mm(e, weight, out=expected[start:end]).div_(total[:, None])
                else:  # the product in the weight's dtype, the division in float32
                    product = torch.mm(low[: end - start].copy_(e), weight)
                    expected[start:end] = product.float().div_(total[:, None])
            lse[start:end] = top + total.log()
            logps[start:end] = picked - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias, targets, lse, expected)
        ctx.options = (temperature, softcap, rows)
        ctx.mark_non_differentiable(entropy, hits)
        return logps, entropy, hits

    @staticmethod
    def backward(ctx, grad_logps, _grad_entropy, _grad_hits):
        hidden, weight, bias, targets, lse, expected = ctx.saved_tensors
        temperature, softcap, rows = ctx.options
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        if expected is not None:  # a frozen head: the forward took E_p[W]
            grad_hidden = (weight[targets].float() - expected).mul_((grad_logps / temperature)[:, None])
            grad_hidden = grad_hidden.to(hidden.dtype)
            return grad_hidden, None, None, None, None, None, None, None, None
        count, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None
        grad_bias = torch.zeros_like(bias) if want_bias else None
        buffer = hidden.new_empty(min(rows, count), vocab, dtype=torch.float32)
        low = _low_buffer(buffer, weight)
        capped = hidden.new_empty(buffer.shape, dtype=torch.float32) if softcap else None
        for start in range(0, count, rows):
            end = min(count, start + rows)
            h, g = hidden[start:end], grad_logps[start:end]
            x = _logits_into(buffer[: end - start], h, weight, bias, temperature, softcap, low)
            if softcap:  # d softcap(l) / d l = 1 - (softcap(l) / softcap)^2
                capped[: end - start].copy_(x).mul_(temperature / softcap).square_().neg_().add_(1.0)
            # d log p(t) / d x = onehot(t) - softmax(x), times the incoming gradient
            x.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])
            x[torch.arange(end - start, device=x.device), targets[start:end]] += g
            if temperature != 1.0:
                x.div_(temperature)
            if softcap:
                x.mul_(capped[: end - start])
            if low is not None:  # the products in the weight's dtype
                x = low[: end - start].copy_(x)
            if want_hidden:
                torch.mm(x, weight, out=grad_hidden[start:end])
            if want_weight:
                grad_weight.addmm_(x.t(), h)
            if want_bias:
                grad_bias.add_(x.sum(0, dtype=torch.float32).to(grad_bias.dtype))
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def fused_scores(head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                 softcap: float | None = None, with_entropy: bool = False, with_hits: bool = True,
                 rows: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(target), entropy, argmax hit) for hidden states [N, H] and targets [N] under softmax(head(h) / T), `rows`
    positions at a time; only the log-probs carry a gradient (to the hidden states, the weight and the bias)."""
    return _FusedHeadScores.apply(hidden, head.weight, head.bias, targets, float(temperature), softcap, with_entropy,
                                  with_hits, max(1, rows))
