"""What vLLM is asked and what it answers: one request per prompt (the text the trainer's processor gets, and its
images and videos), the sampling options from the generation section, and vLLM's answers as a Rollout whose prompt
token ids are checked against the trainer's. `VLLMTurns` samples the turns of a multi-turn tool rollout
(rollout/turns.py) with vLLM: the first as a text prompt, each later one as a token prompt continuing the row."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout, check_no_placeholders, mask_after_eos
from vlm_grpo.grpo.rollout.turns import SampledTurns
from vlm_grpo.images import prepare_sample_image
from vlm_grpo.videos import Video, prepare_sample_video


def prompt_text(adapter, conversation: list[dict], tools: list | None = None) -> str:
    """The prompt text exactly as the adapter renders it for the trainer's encoding (encode_prompts)."""
    return adapter.render_prompt(list(conversation), **getattr(adapter, "chat_template_kwargs", {}),
                                 **({"tools": list(tools)} if tools else {}))


def video_input(video: Video) -> tuple[np.ndarray, dict[str, Any]]:
    """A clip as vLLM takes it: its frames as one uint8 [T, H, W, 3] array and the metadata the trainer's processor
    gets (the frames were sampled when the data was read: vLLM must not sample them again)."""
    meta = video.metadata()
    frames = np.stack([np.asarray(frame.convert("RGB"), dtype=np.uint8) for frame in video.frames])
    return frames, {"fps": float(meta.fps), "duration": float(meta.duration),
                    "total_num_frames": int(meta.total_num_frames), "frames_indices": list(meta.frames_indices),
                    "video_backend": "pyav", "do_sample_frames": False}


def requests(adapter, samples, session=None) -> list[dict[str, Any]]:
    """One vLLM request per sample: the prompt text the trainer's processor gets, and its images and videos; with a
    tool `session`, its conversations, images and template tools (as `generation.encode` encodes them)."""
    out = []
    for i, s in enumerate(samples):
        if session is None:
            text, images = prompt_text(adapter, s.prompt), s.images
        else:
            text = prompt_text(adapter, session.conversations[i], session.template_tools[i])
            images = session.images[i]
        request: dict[str, Any] = {"prompt": text}
        media: dict[str, list] = {}
        if images:
            media["image"] = [prepare_sample_image(img, i) for img in images]
        if s.videos:
            media["video"] = [video_input(prepare_sample_video(v, i)) for v in s.videos]
        if media:
            request["multi_modal_data"] = media
        out.append(request)
    return out


def sampling_options(adapter, gen, num_generations: int, seed: int) -> dict[str, Any]:
    """SamplingParams' arguments from the generation section: G per prompt, each token's log-prob returned. Not
    detokenized: the trainer decodes the ids itself, and vLLM's per-token decoding of the text and of each log-prob's
    token took 4-19% of its generate's CPU time on the bench presets (benchmarks/RESULTS.md, issue 35)."""
    return dict(n=num_generations, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k or -1,
                max_tokens=gen.max_new_tokens, min_tokens=gen.min_new_tokens, logprobs=0, seed=seed,
                stop_token_ids=list(adapter.eos_token_ids), detokenize=False,
                logit_bias={int(t): -100.0 for t in adapter.suppressed_token_ids()})


def check_prompt_ids(theirs: list[int], mine: list[int], where: str) -> None:
    """vLLM's prompt token ids must be the trainer's (image and video tokens included), else the log-probs the loss
    weighs are of another sequence."""
    theirs = list(theirs)
    if theirs != mine:
        at = next((k for k, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
        raise ImageTokenMismatch(f"{where}: vLLM's prompt has {len(theirs)} tokens, the trainer's {len(mine)}, first "
                                 f"differing at position {at}: its processor expands the images or videos otherwise "
                                 "(pixel budget? frame sampling?)")


def prompt_ids(prompts: PromptBatch, i: int) -> list[int]:
    """Sample i's prompt token ids as the trainer encoded them (padding dropped)."""
    return prompts.input_ids[i][prompts.attention_mask[i].bool()].tolist()


def to_rollout(adapter, prompts: PromptBatch, samples, results: list[dict], num_generations: int, device,
               turn: int | None = None) -> Rollout:
    """vLLM's answers ({prompt_token_ids, completions: [{token_ids, logprobs}]} per prompt) as a Rollout, its rows
    prompt-major as the trainer's, with the sampled tokens' log-probs (`sampling_logps`, NaN where none came).
    `turn`: the first turn of a multi-turn rollout (named in a mismatch)."""
    for i, result in enumerate(results):
        where = f"sample {i}" if turn is None else f"sample {i}, every completion, turn {turn}"
        check_prompt_ids(result["prompt_token_ids"], prompt_ids(prompts, i), where)
    rows = [c for r in results for c in r["completions"]]
    width = max(1, max(len(c["token_ids"]) for c in rows))
    ids = torch.full((len(rows), width), adapter.pad_token_id, dtype=torch.long)
    logps = torch.full((len(rows), width), float("nan"), dtype=torch.float32)
    for k, c in enumerate(rows):
        n = len(c["token_ids"])
        ids[k, :n] = torch.tensor(c["token_ids"], dtype=torch.long)
        if c.get("logprobs") is not None:
            logps[k, :n] = torch.tensor([float("nan") if v is None else v for v in c["logprobs"]])
    ids, logps = ids.to(device), logps.to(device)
    mask = mask_after_eos(ids, adapter.eos_token_ids)
    check_no_placeholders(adapter, ids, mask, num_generations)
    eos = torch.tensor(adapter.eos_token_ids, device=device)
    texts = adapter.tokenizer.batch_decode(ids * mask + adapter.pad_token_id * (1 - mask), skip_special_tokens=True)
    return Rollout(
        prompts=prompts, completion_ids=ids, completion_mask=mask, truncated=~torch.isin(ids, eos).any(1),
        completions=texts,
        prompt_texts=[adapter.tokenizer.decode(r, skip_special_tokens=True) for r in prompts.input_ids],
        num_generations=num_generations,
        stats={"prefill_tokens": int(prompts.attention_mask.sum()), "decode_tokens": int(ids.numel())},
        sampling_logps=logps,
    )


def output_results(outputs) -> list[dict]:
    """vLLM RequestOutputs as plain data (the server sends the same over HTTP)."""
    results = []
    for out in outputs:
        completions = []
        for c in out.outputs:
            lps = None
            if c.logprobs is not None:
                lps = [None if d is None or t not in d else float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
            completions.append({"token_ids": list(c.token_ids), "logprobs": lps})
        results.append({"prompt_token_ids": list(out.prompt_token_ids), "completions": completions})
    return results


class VLLMTurns:
    """The tool loop's model turns sampled by vLLM (a TurnEngine of rollout/turns.py), checked turn by turn.

    The first turn is the one-turn request: the prompt text rendered from the conversation and tools the trainer
    encoded, its images and videos, G completions. A later turn continues each row as a token prompt, since vLLM expands image and
    video placeholders in token prompts itself: the prompt's ids as the tokenizer alone gives them, then the row's
    turns so far (the model's as sampled, each tool turn as the tokenizer alone gives its text), with the prompt's
    images and videos and then the tool turns' images, in order. vLLM's expanded ids must then be the trainer's
    prompt + row, on every turn.

    Each continuing row is its own request with its own sampling options: its own seed (from the step's seed, the
    turn and the row: rows of one group with the same history must not draw alike, as one seed for a whole call
    would make them) and its own budget (what is left of max_new_tokens)."""

    def __init__(self, engine, session, seed: int):
        self.engine, self.session, self.seed = engine, session, seed
        # the processes of a tensor-parallel engine sample every turn together (colocate.py's gloo group)
        self.group = getattr(engine, "tp_group", None)
        self.samples_together = self.group is not None

    def any_continues(self, here: bool) -> bool:
        """Whether this process, or any process sampling with it, has rows that call tools."""
        if self.group is None:
            return here
        flag = torch.tensor([int(here)])
        options = torch.distributed.AllreduceOptions()
        options.reduceOp = torch.distributed.ReduceOp.MAX
        self.group.allreduce([flag], options).wait()
        return bool(flag.item())

    def first(self, loop, samples, num_generations, prompts, features) -> Rollout:
        adapter = loop.adapter
        reqs = requests(adapter, samples, self.session)
        self.prompts, self.num_generations = prompts, num_generations
        self.media = [r.get("multi_modal_data", {}) for r in reqs]
        # as the processor tokenizes the prompt text, less the expansion of its placeholders (vLLM's to do)
        self.plain_prompts = [adapter.tokenizer(r["prompt"])["input_ids"] for r in reqs]
        results = self.engine.generate(reqs, sampling_options(adapter, loop.gen, num_generations, self.seed))
        return to_rollout(adapter, prompts, samples, results, num_generations, loop.device, turn=1)

    def turn_seed(self, turn: int, row: int) -> int:
        """Row `row`'s seed on `turn` (> 1): apart from every other row's and turn's."""
        return (self.seed + 1_000_003 * (turn - 1) + row) % (2**31 - 1)

    def request(self, row) -> dict[str, Any]:
        """The row's continuation: its unexpanded ids so far, the prompt's images and videos, then its tools'."""
        media = dict(self.media[row.prompt])
        if row.tool_images:
            shown = [prepare_sample_image(img, row.prompt) for img in row.tool_images]
            media["image"] = [*media.get("image", []), *shown]
        request: dict[str, Any] = {"prompt_token_ids": self.plain_prompts[row.prompt] + row.plain}
        if media:
            request["multi_modal_data"] = media
        return request

    def next(self, loop, rows, max_new_tokens, turn):
        """Each row's next turn (n=1, within the budget it has left), in one call, its prompt ids checked."""
        adapter, g = loop.adapter, self.num_generations
        options = []
        for k, row in enumerate(rows):
            option = sampling_options(adapter, loop.gen, 1, self.turn_seed(turn, row.index))
            option.update(max_tokens=max(1, loop.gen.max_new_tokens - len(row.ids)), min_tokens=0)
            options.append(option)
        results = self.engine.generate([self.request(row) for row in rows], options)
        ids: list[list[int]] = [[] for _ in rows]
        logps: list[list[float]] = [[] for _ in rows]
        prefill = decode = 0
        for k, (row, result) in enumerate(zip(rows, results)):
            check_prompt_ids(result["prompt_token_ids"], prompt_ids(self.prompts, row.prompt) + row.ids,
                             f"sample {row.prompt}, completion {row.index % g}, turn {turn}")
            c = result["completions"][0]
            ids[k] = list(c["token_ids"])
            logps[k] = [math.nan if v is None else float(v) for v in c["logprobs"]] \
                if c.get("logprobs") is not None else [math.nan] * len(ids[k])
            prefill += len(result["prompt_token_ids"])
            decode += len(ids[k])
        return SampledTurns(ids, logps, prefill, decode)
