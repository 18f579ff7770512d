"""What vLLM is asked and what it answers: one request per prompt (the text the trainer's processor gets, and its
images), the sampling options from the generation section, and vLLM's answers as a Rollout whose prompt token ids
are checked against the trainer's."""

from __future__ import annotations

from typing import Any

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout, check_no_placeholders, mask_after_eos
from vlm_grpo.images import prepare_sample_image


def requests(adapter, samples) -> list[dict[str, Any]]:
    """One vLLM request per sample: the prompt text the trainer's processor gets, and its images."""
    out = []
    for i, s in enumerate(samples):
        if s.videos:
            raise ValueError(f"sample {i}: rollout.engine vllm takes images only here; a video prompt runs on the "
                             "transformers engine")
        text = adapter.processor.apply_chat_template(list(s.prompt), add_generation_prompt=True, tokenize=False)
        request: dict[str, Any] = {"prompt": text}
        if s.images:
            request["multi_modal_data"] = {"image": [prepare_sample_image(img, i) for img in s.images]}
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


def to_rollout(adapter, prompts: PromptBatch, samples, results: list[dict], num_generations: int, device) -> Rollout:
    """vLLM's answers ({prompt_token_ids, completions: [{token_ids, logprobs}]} per prompt) as a Rollout, its rows
    prompt-major as the trainer's, with the sampled tokens' log-probs (`sampling_logps`, NaN where none came)."""
    for i, result in enumerate(results):
        mine = prompts.input_ids[i][prompts.attention_mask[i].bool()].tolist()
        if list(result["prompt_token_ids"]) != mine:
            raise ImageTokenMismatch(f"sample {i}: vLLM's prompt has {len(result['prompt_token_ids'])} tokens, the "
                                     f"trainer's {len(mine)}, and they differ: its processor expands the images "
                                     "otherwise (pixel budget?)")
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
