"""Multi-turn rollouts with tools (TRL 1.16's loop): sample, run the calls, show the results, sample again.

1. The first turn is the ordinary rollout (each prompt encoded and prefilled once, G completions sampled).
2. Each completion's latest turn is parsed (chat_format.py); its calls run (calls.py) and their results, text or
   images or both, become one tool turn: rendered by the chat template, encoded by the adapter like a prompt (the
   processor expands each image's tokens, checked against the features), appended to the completion.
3. The new images are encoded once (one vision call per round, every completion's new images together), and the
   completions that called tools continue from prompt + everything so far: the prompt's image features and the
   turns' are placed into the sequence (no image is encoded twice) and generation samples the next turn.
4. Until no completion calls a tool, `max_iterations` rounds, or the token budget (`max_new_tokens` counts every
   completion token, the tools' included, as TRL's max_completion_length): a tool turn that would not fit is
   dropped and the completion ends with the turn that called it (TRL's rule).
The completion keeps which tokens are the model's own (`tool_mask`): only those train. A malformed call is counted
and ends its completion; a failed call (raised, unknown tool, timed out) returns its error as the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.completion_images import CompletionImages
from vlm_grpo.adapters.features import ImageFeatures
from vlm_grpo.adapters.sharing import generate_shared, image_features
from vlm_grpo.grpo.rollout.generation import Rollout, check_no_placeholders, mask_after_eos, rollout, sampling_settings
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import ToolSession

@dataclass
class _Row:
    """One completion being built: its tokens so far (the model's and the tools'), and what it did."""

    prompt: int
    ids: list[int]
    own: list[int]  # 1: the model's own token, 0: a tool turn's
    ended: bool  # the latest model turn ended with an end-of-turn token (else the budget cut it)
    types: dict[str, list[int]] = field(default_factory=dict)  # token-shaped values (tool images), aligned with ids
    turns: list[int] = field(default_factory=list)  # the image turns it shows (indices into the step's turns)
    messages: list[dict] = field(default_factory=list)  # the conversation after the prompt (TRL's completion)
    last: list[int] = field(default_factory=list)  # the model's latest turn
    active: bool = True
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("calls", "failed", "malformed", "timeouts",
                                                                          "turns", "images"), 0))

    def add(self, ids: list[int], own: int, types: dict[str, list[int]] | None = None) -> None:
        start = len(self.ids)
        for key in set(self.types) | set(types or {}):
            self.types.setdefault(key, [0] * start).extend((types or {}).get(key, [0] * len(ids)))
        self.ids += ids
        self.own += [own] * len(ids)


def _model_turn(ids: list[int], eos: set[int], budget: int) -> tuple[list[int], bool]:
    """A sampled turn up to and including its first end-of-turn token, within `budget`; whether it ended."""
    for k, tok in enumerate(ids[:budget]):
        if tok in eos:
            return ids[: k + 1], True
    return ids[:budget], False


def _describe(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] if p["type"] == "text" else f"<image {p['image'].width}x{p['image'].height}>"
                   for p in content)


def transcript(messages: list[dict]) -> str:
    """A completion's trajectory as text: the model's turns, each tool call and result, images as markers."""
    lines = []
    for m in messages:
        if m["role"] == "assistant":
            calls = [f"<tool_call {c['function']['name']}({c['function'].get('arguments', {})})>"
                     for c in m.get("tool_calls", [])]
            lines.append(" ".join([m.get("content") or "", *calls]).strip())
        else:
            lines.append(f"[{m.get('name', 'tool')}] {_describe(m['content'])}")
    return "\n".join(lines)


def loggable_messages(messages: list[dict]) -> list[dict]:
    """A completion's messages as completions.jsonl holds them: images become {"type": "image", "size": [w, h]}."""
    def part(p: dict) -> dict:
        return {"type": "image", "size": list(p["image"].size)} if p.get("type") == "image" else dict(p)

    return [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m.get("content"), list) else dict(m)
            for m in messages]


class ToolRollout:
    """Builds one batch's multi-turn completions. `encode_images(batch) -> ImageFeatures`: the tool images' encoder
    (the trainer's keeps the gradient when the policy's features are taken once for the update)."""

    def __init__(self, adapter, session: ToolSession, fmt: ChatFormat, gen, device, *, shared_prefix: bool = True,
                 max_iterations: int | None = None, encode_images: Callable[[PromptBatch], ImageFeatures] | None = None,
                 use_cache: bool | None = None):
        self.adapter, self.session, self.fmt, self.gen, self.device = adapter, session, fmt, gen, device
        self.shared_prefix, self.max_iterations, self.use_cache = shared_prefix, max_iterations, use_cache
        self.encode_images = encode_images or self._no_grad_features
        self.eos = set(adapter.eos_token_ids)
        self.image_batches: list[PromptBatch] = []  # per round with images: its image turns, encoded
        self.turn_features: list[ImageFeatures] = []  # per round with images: their features
        self.where: list[tuple[int, int]] = []  # image turn -> (round batch, sample in it)
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0}

    @classmethod
    def sample(cls, adapter, samples, gen, num_generations: int, device, session: ToolSession, fmt: ChatFormat,
               prompts: PromptBatch, *, features: ImageFeatures | None = None, encoder: torch.nn.Module | None = None,
               **options) -> Rollout:
        """One batch's multi-turn completions; `encoder`: the model whose tool-image features keep their gradient
        (the policy, when its features are taken once for the update), else they are encoded without."""
        encode = None if encoder is None else (lambda batch: image_features(adapter, batch, model=encoder))
        return cls(adapter, session, fmt, gen, device, encode_images=encode, **options).run(
            samples, num_generations, prompts, features=features)

    def _no_grad_features(self, batch: PromptBatch) -> ImageFeatures:
        with torch.no_grad():
            return image_features(self.adapter, batch)

    # ---------------------------------------------------------------- the loop
    def run(self, samples, num_generations: int, prompts: PromptBatch, features: ImageFeatures | None = None) -> Rollout:
        first = rollout(self.adapter, samples, self.gen, num_generations, self.device, use_cache=self.use_cache,
                        shared_prefix=self.shared_prefix, prompts=prompts, features=features)
        self.stats = dict(first.stats)
        self.prompts, self.prompt_features = prompts, first.features if first.features is not None else features
        rows = []
        for r, (ids, mask) in enumerate(zip(first.completion_ids.tolist(), first.completion_mask.tolist())):
            turn = ids[: sum(mask)]
            row = _Row(prompt=r // num_generations, ids=[], own=[], ended=bool(turn) and turn[-1] in self.eos, last=turn)
            row.add(turn, 1)
            rows.append(row)
        rounds = 0
        while True:
            calling = self._read_turns(rows)
            if not calling or (self.max_iterations is not None and rounds >= self.max_iterations):
                break
            continuing = self._tool_turns(calling)
            if continuing:
                self._continue(continuing)
            rounds += 1
        return self._finish(first, rows)

    def _read_turns(self, rows: list[_Row]) -> list[tuple[int, _Row, list[dict]]]:
        """Parse every active row's latest turn; the rows that call tools, with their calls."""
        calling = []
        for r, row in enumerate(rows):
            if not row.active:
                continue
            prefix = self._prompt_ids(row) + row.ids[: len(row.ids) - len(row.last)] if self.fmt.parses_with_prefix else []
            parsed = self.fmt.parse(row.last, prefix, self.session.tools[r])
            row.messages.append(parsed.message)
            row.counts["turns"] += 1
            row.counts["malformed"] += parsed.malformed
            row.active = bool(parsed.calls) and row.ended
            if row.active:
                calling.append((r, row, parsed.calls))
        return calling

    def _tool_turns(self, calling) -> list[_Row]:
        """Run the calls, encode the tool turns, keep those within the budget; the rows that continue."""
        results = []
        for r, row, calls in calling:
            results.append(self.session.run(r, calls))
            row.counts["calls"] += len(calls)
            row.counts["failed"] += sum(x.failed for x in results[-1])
            row.counts["timeouts"] += sum(x.timed_out for x in results[-1])
        texts = [self.fmt.tool_turn([x.message() for x in res]) for res in results]
        images = [[img for x in res for img in x.images] for res in results]
        batch = self.adapter.encode_turns(texts, images)  # every tool turn of the round, one processor call
        kept, shown = [], []
        for k, ((r, row, _), res) in enumerate(zip(calling, results)):
            keep = batch.attention_mask[k].bool()
            ids = batch.input_ids[k][keep].tolist()
            if len(row.ids) + len(ids) > self.gen.max_new_tokens:  # the result does not fit: the completion ends
                row.active = False
                continue
            row.messages += [x.message() for x in res]
            row.add(ids, 0, {key: batch.mm[key][k][keep].tolist() for key in batch.token_keys})
            kept.append(row)
            if images[k]:
                row.counts["images"] += len(images[k])
                row.turns.append(len(self.where) + len(shown))
                shown.append(k)
        if shown:  # the round's images, encoded once, all completions' together
            dtype = next(self.adapter.model.parameters()).dtype
            shown_batch = batch.select(shown).to(self.device, dtype=dtype)
            self.where += [(len(self.image_batches), j) for j in range(len(shown))]
            self.image_batches.append(shown_batch)
            self.turn_features.append(self.encode_images(shown_batch))
        return [row for row in kept if len(row.ids) < self.gen.max_new_tokens]

    def _prompt_ids(self, row: _Row) -> list[int]:
        keep = self.prompts.attention_mask[row.prompt].bool()
        return self.prompts.input_ids[row.prompt][keep].tolist()

    # ---------------------------------------------------------------- continuing generation
    def _batch(self, rows: list[_Row]) -> PromptBatch:
        """Prompt + completion so far of each row as one left-padded batch holding all its images."""
        prompts, adapter = self.prompts, self.adapter
        keys = tuple(dict.fromkeys([*prompts.token_keys, *(k for b in self.image_batches for k in b.token_keys),
                                    *(k for row in rows for k in row.types)]))
        seqs = [self._prompt_ids(row) + row.ids for row in rows]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(rows), width), adapter.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        types = {k: torch.zeros(len(rows), width, dtype=torch.long) for k in keys}
        for k, (row, seq) in enumerate(zip(rows, seqs)):
            ids[k, width - len(seq):], mask[k, width - len(seq):] = torch.tensor(seq), 1
            keep = prompts.attention_mask[row.prompt].bool()
            for key in keys:
                head = prompts.mm[key][row.prompt][keep].tolist() if key in prompts.mm else [0] * int(keep.sum())
                types[key][k, width - len(seq):] = torch.tensor(head + row.types.get(key, [0] * len(row.ids)))
        sources = [[(prompts, row.prompt)] + [(self.image_batches[b], j) for b, j in (self.where[t] for t in row.turns)]
                   for row in rows]
        image_keys = [k for k in dict.fromkeys([*prompts.mm, *(k for b in self.image_batches for k in b.mm)])
                      if k not in keys]
        mm, mm_rows = adapter.combine_images(sources, image_keys)
        mm.update({k: v.to(self.device) for k, v in types.items()})
        mm_rows.update({k: [1] * len(rows) for k in keys})
        return PromptBatch(ids.to(self.device), mask.to(self.device), mm, mm_rows, [[] for _ in rows], keys)

    def _features(self, rows: list[_Row]) -> ImageFeatures | None:
        """Each row's image features in sequence order (the prompt's, then its turns'), none encoded again."""
        if self.prompt_features is None:
            return None
        parts = ImageFeatures.concat([self.prompt_features, *self.turn_features])
        first = [len(self.prompt_features)]
        for f in self.turn_features:
            first.append(first[-1] + len(f))
        return parts.gather([[row.prompt] + [first[b] + j for b, j in (self.where[t] for t in row.turns)]
                             for row in rows]).detach()

    def _continue(self, rows: list[_Row]) -> None:
        batch = self._batch(rows)
        room = [self.gen.max_new_tokens - len(row.ids) for row in rows]
        settings = sampling_settings(self.gen, self.use_cache, max(room))
        if self.shared_prefix:
            result = generate_shared(self.adapter, batch, 1, features=self._features(rows), **settings)
            out, prefill = result.output, result.prefill_tokens
        else:
            out, prefill = self.adapter.generate(batch, **settings), int(batch.attention_mask.sum())
        new = out.sequences[:, batch.input_ids.shape[1]:]
        check_no_placeholders(self.adapter, new, mask_after_eos(new, self.adapter.eos_token_ids), 1)
        self.stats["prefill_tokens"] += prefill
        self.stats["decode_tokens"] += int(new.numel())
        for row, ids, budget in zip(rows, new.tolist(), room):
            turn, row.ended = _model_turn(ids, self.eos, budget)
            row.last = turn
            row.add(turn, 1)

    # ---------------------------------------------------------------- the result
    def _finish(self, first: Rollout, rows: list[_Row]) -> Rollout:
        n, width = len(rows), max(1, max(len(row.ids) for row in rows))
        ids = torch.full((n, width), self.adapter.pad_token_id, dtype=torch.long)
        mask, own = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)
        keys = {k for row in rows for k in row.types}
        types = {k: torch.zeros(n, width, dtype=torch.long) for k in keys}
        for r, row in enumerate(rows):
            length = len(row.ids)
            ids[r, :length], mask[r, :length], own[r, :length] = torch.tensor(row.ids), 1, torch.tensor(row.own)
            for k in keys:
                types[k][r, :length] = torch.tensor(row.types.get(k, [0] * length))
        images, features = None, None
        if self.image_batches:  # every image turn of the step as one batch of image tensors (tokens live in ids)
            sources = [[(self.image_batches[b], j)] for b, j in self.where]
            image_keys = [k for k in dict.fromkeys(k for b in self.image_batches for k in b.mm)
                          if not any(k in b.token_keys for b in self.image_batches)]
            mm, mm_rows = self.adapter.combine_images(sources, image_keys)
            spans = [self.image_batches[b].image_spans[j] for b, j in self.where]
            placeholder = torch.zeros(len(sources), 1, dtype=torch.long, device=self.device)
            turns = PromptBatch(placeholder, torch.ones_like(placeholder), mm, mm_rows, spans)
            features = ImageFeatures.concat(self.turn_features)
            images = CompletionImages(turns, [list(row.turns) for row in rows],
                                      {k: v.to(self.device) for k, v in types.items()}, features.detach())
        total = {k: sum(row.counts[k] for row in rows) for k in rows[0].counts}
        metrics = {
            "call_frequency": total["calls"] / n,  # TRL's names: tool calls per completion, failed share of calls
            "failure_frequency": total["failed"] / total["calls"] if total["calls"] else 0.0,
            "failed_calls": total["failed"] / n, "malformed_calls": total["malformed"] / n,
            "timeouts": total["timeouts"] / n, "turns": total["turns"] / n, "images": total["images"] / n,
        }
        return Rollout(
            prompts=first.prompts, completion_ids=ids.to(self.device), completion_mask=mask.to(self.device),
            truncated=torch.tensor([not (row.ended and row.ids and row.ids[-1] in self.eos) for row in rows],
                                   device=self.device),
            completions=[transcript(row.messages) for row in rows], prompt_texts=first.prompt_texts,
            num_generations=first.num_generations, features=first.features, stats=self.stats,
            tool_mask=own.to(self.device), completion_images=images, conversations=[row.messages for row in rows],
            tool_metrics=metrics, turn_features=features,
        )
