"""Multi-turn rollouts with tools (TRL 1.16's loop): sample, run the calls, show the results, sample again.

One loop for every engine: what samples the model's turns is a `TurnEngine` (`GenerateTurns`, transformers'
generate; the vLLM engine's `VLLMTurns`, rollout/vllm/requests.py); the calls, the budget, `tool_mask` and the
conversations are the loop's alone.
1. The first turn is the ordinary rollout (each prompt encoded and prefilled once, G completions sampled).
2. Each completion's latest turn is parsed (chat_format.py); its calls run (calls.py) and their results, text or
   images or both, become one tool turn: rendered by the chat template, encoded by the adapter like a prompt (the
   processor expands each image's tokens, checked against the features), appended to the completion.
3. The new images are encoded once (one vision call per round, every completion's new images together), and the
   completions that called tools continue from prompt + everything so far: the prompt's image features and the
   turns' are placed into the sequence (no image is encoded twice) and generation samples the next turn.
   (vLLM continues each row from its token ids instead, its images passed beside them: `VLLMTurns`.)
4. Until no completion calls a tool, `max_iterations` rounds, or the token budget (`max_new_tokens` counts every
   completion token, the tools' included, as TRL's max_completion_length): a tool turn that would not fit is
   dropped and the completion ends with the turn that called it (TRL's rule).
The completion keeps which tokens are the model's own (`tool_mask`): only those train. A malformed call is counted
and ends its completion; a failed call (raised, unknown tool, timed out) returns its error as the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.completion_images import CompletionImages
from vlm_grpo.adapters.features import ImageFeatures
from vlm_grpo.adapters.sharing import generate_shared, image_features
from vlm_grpo.grpo.rollout.generation import Rollout, rollout, sampling_settings
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import ToolSession


@dataclass
class _Row:
    """One completion being built: its tokens so far (the model's and the tools'), and what it did."""

    index: int  # its row in the batch: its sample is index // G, its completion index % G
    prompt: int
    ids: list[int]
    own: list[int]  # 1: the model's own token, 0: a tool turn's
    ended: bool  # the latest model turn ended with an end-of-turn token (else the budget cut it)
    types: dict[str, list[int]] = field(default_factory=dict)  # token-shaped values (tool images), aligned with ids
    # the same turns with each tool turn as the tokenizer alone gives it (image placeholders not expanded): what an
    # engine that expands them itself continues from (vLLM)
    plain: list[int] = field(default_factory=list)
    tool_images: list[Any] = field(default_factory=list)  # the images its tool turns showed, in order
    logps: list[float] = field(default_factory=list)  # the engine's log-prob of each token (NaN: a tool's, or none)
    turns: list[int] = field(default_factory=list)  # the image turns it shows (indices into the step's turns)
    messages: list[dict] = field(default_factory=list)  # the conversation after the prompt (TRL's completion)
    last: list[int] = field(default_factory=list)  # the model's latest turn
    active: bool = True
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("calls", "failed", "malformed", "timeouts",
                                                                          "turns", "images"), 0))

    def add(self, ids: list[int], own: int, types: dict[str, list[int]] | None = None, plain: list[int] | None = None,
            logps: list[float] | None = None) -> None:
        start = len(self.ids)
        for key in set(self.types) | set(types or {}):
            self.types.setdefault(key, [0] * start).extend((types or {}).get(key, [0] * len(ids)))
        self.ids += ids
        self.own += [own] * len(ids)
        self.plain += ids if plain is None else plain
        self.logps += [math.nan] * len(ids) if logps is None else list(logps)


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


@dataclass
class SampledTurns:
    """An engine's next turn for the rows that continue, in their order: each row's sampled tokens (up to the largest
    budget; the loop cuts each row to its own)."""

    ids: list[list[int]]
    logps: list[list[float]] | None  # the engine's log-prob of each sampled token (vLLM's); None: the policy sampled
    prefill_tokens: int
    decode_tokens: int


class TurnEngine(Protocol):
    """What samples the model's turns of the tool loop: every rollout's first turn (G per prompt, as a one-turn
    rollout), then the next turn of the rows that continue (`turn`: its number, the first being 1)."""

    def first(self, loop: "ToolRollout", samples, num_generations: int, prompts: PromptBatch,
              features: ImageFeatures | None) -> Rollout: ...

    def next(self, loop: "ToolRollout", rows: list[_Row], max_new_tokens: int, turn: int) -> SampledTurns: ...

    # an engine whose processes sample together (vLLM tensor parallel) takes every round's `next` on each of them,
    # with no rows where a process has none; `any_continues(here)`: whether any of them has rows that call tools
    samples_together: bool

    def any_continues(self, here: bool) -> bool: ...


class GenerateTurns:
    """The transformers engine: the first turn from each prompt prefilled once (`shared_prefix`), a later one from
    each row's whole sequence with every image's features placed (none encoded again)."""

    def __init__(self, shared_prefix: bool = True, use_cache: bool | None = None):
        self.shared_prefix, self.use_cache = shared_prefix, use_cache

    samples_together = False

    def any_continues(self, here: bool) -> bool:
        return here

    def first(self, loop, samples, num_generations, prompts, features):
        return rollout(loop.adapter, samples, loop.gen, num_generations, loop.device, use_cache=self.use_cache,
                       shared_prefix=self.shared_prefix, prompts=prompts, features=features)

    def next(self, loop, rows, max_new_tokens, turn):
        batch = loop._batch(rows)
        settings = sampling_settings(loop.gen, self.use_cache, max_new_tokens)
        if self.shared_prefix:
            result = generate_shared(loop.adapter, batch, 1, features=loop._features(rows), **settings)
            out, prefill = result.output, result.prefill_tokens
        else:
            out, prefill = loop.adapter.generate(batch, **settings), int(batch.attention_mask.sum())
        new = out.sequences[:, batch.input_ids.shape[1]:]
        return SampledTurns(new.tolist(), None, prefill, int(new.numel()))


class ToolRollout:
    """Builds one batch's multi-turn completions. `encode_images(batch) -> ImageFeatures`: the tool images' encoder
    (the trainer's keeps the gradient when the policy's features are taken once for the update). `engine`: what
    samples the turns (default: transformers' generate, with `shared_prefix` and `use_cache`)."""

    def __init__(self, adapter, session: ToolSession, fmt: ChatFormat, gen, device, *, shared_prefix: bool = True,
                 max_iterations: int | None = None, encode_images: Callable[[PromptBatch], ImageFeatures] | None = None,
                 use_cache: bool | None = None, engine: TurnEngine | None = None):
        self.adapter, self.session, self.fmt, self.gen, self.device = adapter, session, fmt, gen, device
        self.max_iterations = max_iterations
        self.engine = engine or GenerateTurns(shared_prefix, use_cache)
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
        self.num_generations = num_generations
        first = self.engine.first(self, samples, num_generations, prompts, features)
        self.stats = dict(first.stats)
        self.prompts, self.prompt_features = prompts, first.features if first.features is not None else features
        engine_logps = None if first.sampling_logps is None else first.sampling_logps.tolist()
        rows = []
        for r, (ids, mask) in enumerate(zip(first.completion_ids.tolist(), first.completion_mask.tolist())):
            turn = ids[: sum(mask)]
            row = _Row(index=r, prompt=r // num_generations, ids=[], own=[],
                       ended=bool(turn) and turn[-1] in self.eos, last=turn)
            row.add(turn, 1, logps=None if engine_logps is None else engine_logps[r][: len(turn)])
            rows.append(row)
        rounds = 0
        while True:
            calling = self._read_turns(rows)
            if self.max_iterations is not None and rounds >= self.max_iterations:
                break
            if not self.engine.any_continues(bool(calling)):  # no row calls a tool (on any process sampling together)
                break
            continuing = self._tool_turns(calling) if calling else []
            if continuing or self.engine.samples_together:
                self._continue(continuing, turn=rounds + 2)
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
        plain = self.adapter.tokenizer(texts, add_special_tokens=False)["input_ids"]  # placeholders unexpanded
        kept, shown = [], []
        for k, ((r, row, _), res) in enumerate(zip(calling, results)):
            keep = batch.attention_mask[k].bool()
            ids = batch.input_ids[k][keep].tolist()
            if len(row.ids) + len(ids) > self.gen.max_new_tokens:  # the result does not fit: the completion ends
                row.active = False
                continue
            row.messages += [x.message() for x in res]
            row.add(ids, 0, {key: batch.mm[key][k][keep].tolist() for key in batch.token_keys}, plain=plain[k])
            row.tool_images += images[k]
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

    def _continue(self, rows: list[_Row], turn: int) -> None:
        """The next model turn of each row, sampled within what is left of its budget."""
        room = [self.gen.max_new_tokens - len(row.ids) for row in rows]
        sampled = self.engine.next(self, rows, max(room, default=0), turn)
        cut = [_model_turn(ids, self.eos, budget) for ids, budget in zip(sampled.ids, room)]
        for row, (ids, _) in zip(rows, cut):
            if self.adapter.image_token_id in ids:  # a generated placeholder would shift image features onto text
                raise ImageTokenMismatch(
                    f"sample {row.prompt}, completion {row.index % self.num_generations}, turn {turn}: generated the "
                    f"image placeholder id {self.adapter.image_token_id}; it must be suppressed "
                    "(adapter.suppressed_token_ids)")
        self.stats["prefill_tokens"] += sampled.prefill_tokens
        self.stats["decode_tokens"] += sampled.decode_tokens
        for k, (row, (ids, ended)) in enumerate(zip(rows, cut)):
            row.last, row.ended = ids, ended
            row.add(ids, 1, logps=None if sampled.logps is None else sampled.logps[k][: len(ids)])

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
        sampling_logps = None
        if first.sampling_logps is not None:  # the engine's own log-probs: NaN at tool turns' tokens and padding
            sampling_logps = torch.full((n, width), math.nan, dtype=torch.float32)
            for r, row in enumerate(rows):
                sampling_logps[r, : len(row.logps)] = torch.tensor(row.logps, dtype=torch.float32)
            sampling_logps = sampling_logps.to(self.device)
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
            tool_metrics=metrics, turn_features=features, sampling_logps=sampling_logps,
        )
