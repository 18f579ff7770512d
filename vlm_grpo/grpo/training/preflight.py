"""Pre-flight checks on the real model and data, before a long job (`vlm-grpo check`; `train` runs the cheap ones).

Each check returns a `Finding` (ok or not, one line saying what was measured). Cheap: the recipe's first samples
encode with image tokens equal to image features, the sequence budget (prompt + image tokens + completion) fits
the model, and the suppressed ids hold the image placeholder but no end-of-sequence id. Costly: the cache probe
and one left-padded batch against the same samples one by one. `check_drawn_sample` is the per-sample part a run
applies to every sample the first time it is drawn (grpo/parts/training_data.py).
"""

from __future__ import annotations

import errno
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.grpo.data.token_chars import longest_token_chars, prompt_chars
from vlm_grpo.grpo.logprobs.completions import token_logprobs
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.resource_limits import ResourceLimitReached, size_pair

log = logging.getLogger(__name__)


def check_mixed_precision(mode: str, device: str | None = None) -> None:
    """Mixed precision the run's device cannot honour, refused naming the setting: accelerate would otherwise train
    in float32 without a word (fp16 on a CPU) or fail inside the first step (bf16 on a GPU without bfloat16).
    bf16 on a CPU is honoured, and said to be slow where the CPU has no native bfloat16 (training/precision.py)."""
    from vlm_grpo.grpo.training.precision import bf16_is_fast

    if mode == "no":
        return
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if target.type == "cpu" and not torch.cuda.is_available() and mode == "fp16":
        raise SettingError("mixed_precision", "fp16 on a CPU: accelerate runs no fp16 autocast there and would train "
                           "in float32; use bf16 or no")
    if target.type == "cuda" and mode == "bf16" and not torch.cuda.is_bf16_supported():
        raise SettingError("mixed_precision", f"bf16: {torch.cuda.get_device_name(target)} has no bfloat16 support; "
                           "use fp16 or no")
    if target.type == "cpu" and mode == "bf16" and not bf16_is_fast(target):  # honoured, but not for free: say so
        log.warning("mixed_precision bf16 on a CPU without native bfloat16 (no AMX-BF16 or AVX512-BF16 flag): torch "
                    "emulates its bfloat16 matmuls there, slower than float32")


@dataclass
class Finding:
    check: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.check}: {self.detail}"


def _device_batch(adapter, samples):
    param = next(adapter.model.parameters())
    batch = adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples],
                                   [s.videos for s in samples])
    return batch.to(param.device, dtype=param.dtype)


def check_alignment(adapter, samples) -> tuple[Finding, PromptBatch | None]:
    """The finding, and the samples' batch when they encode (the next checks read it)."""
    try:
        batch = adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples],
                                   [s.videos for s in samples])
    except (ImageTokenMismatch, ValueError) as err:
        return Finding("image tokens = image features", False, str(err)), None
    counts = [a + b for a, b in zip(adapter.feature_counts(batch), adapter.video_feature_counts(batch))]
    return Finding("image tokens = image features", True, f"{len(samples)} samples, {min(counts)}-{max(counts)} image "
                   f"and video tokens each (= the features their images and videos give)"), batch


def check_budget(adapter, batch: PromptBatch, max_new_tokens: int, names: list[str] | None = None) -> Finding:
    """Prompt + image tokens + max_new_tokens of the longest sample against the model's positions; a failure names
    that sample (`names`: each sample's file and row, or recipe and row) and the settings that shorten it."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    longest = int(max(lengths)) + max_new_tokens
    limit = position_limit(adapter)
    per_image = [len(adapter.image_token_indices(batch, i, k)) for i, n in enumerate(batch.images_per_sample)
                 for k in range(n)]
    detail = f"prompts of {int(min(lengths))}-{int(max(lengths))} tokens, "
    if per_image:
        detail += f"images cost {min(per_image)}-{max(per_image)} tokens each; "
    per_video = [(len(adapter.video_token_indices(batch, i, k)), len(batch.video_spans[i][k]))
                 for i, n in enumerate(batch.videos_per_sample) for k in range(n)]
    if per_video:
        tokens, units = [t for t, _ in per_video], [u for _, u in per_video]
        detail += (f"videos cost {min(tokens)}-{max(tokens)} tokens each ({min(units)}-{max(units)} frame units of "
                   f"{min(t // u for t, u in per_video)}-{max(t // u for t, u in per_video)}); ")
    detail += f"with {max_new_tokens} new tokens the longest sequence is {longest}"
    if limit is not None and longest > limit:
        worst = max(range(len(lengths)), key=lambda i: lengths[i])
        name = names[worst] if names else f"sample {worst}"
        return Finding("sequence budget", False, f"{name}: " + too_long(
            int(lengths[worst]), max_new_tokens, limit, batch.images_per_sample[worst], batch.videos_per_sample[worst]))
    return Finding("sequence budget", True, detail + (f" of the model's {limit}" if limit else ""))


def too_long(prompt: int, max_new_tokens: int, limit: int, images: int, videos: int) -> str:
    """Why a sample does not fit the model's positions, and the settings that make it fit: the media ones only for
    the media the sample has."""
    media = " and ".join(part for part in (f"{images} image{'s' * (images != 1)}" if images else "",
                                           f"{videos} video{'s' * (videos != 1)}" if videos else "") if part)
    room = limit - prompt
    fixes = [f"lower generation.max_new_tokens (to at most {room})" if room > 0 else ""]
    if images:
        fixes.append("use smaller images (data.recipe_options {image_size: N} for a built-in recipe, or smaller "
                     "image files)")
    if videos:
        fixes.append("take fewer or smaller video frames (data.video_frames, data.video_max_pixels)")
    fixes.append("shorten this row's prompt")
    return (f"prompt{' with its ' + media if media else ''} takes {prompt} tokens; with generation.max_new_tokens "
            f"{max_new_tokens} that is {prompt + max_new_tokens}, above the model's {limit} positions: "
            + ", or ".join(f for f in fixes if f))


def check_suppressed(adapter) -> Finding:
    suppressed = adapter.suppressed_token_ids()
    names = adapter.tokenizer.convert_ids_to_tokens(suppressed)
    names = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    if adapter.reads_images and adapter.image_token_id not in suppressed:
        return Finding("suppressed ids", False, f"the image placeholder {adapter.image_token_id} is not suppressed")
    stops = set(adapter.eos_token_ids) & set(suppressed)
    if stops:
        return Finding("suppressed ids", False, f"end-of-sequence ids {sorted(stops)} are suppressed: the policy could never stop")
    return Finding("suppressed ids", True, f"{len(suppressed)} never generated ({names})")


def _longer(sample):
    """`sample` with more words in its last user turn: a neighbour that makes the others left-padded."""
    from dataclasses import replace

    turn = dict(sample.prompt[-1])
    content = turn["content"]
    extra = " Take your time and look at every part of the picture before you answer."
    turn["content"] = content + extra if isinstance(content, str) else [*content, {"type": "text", "text": extra}]
    return replace(sample, prompt=[*sample.prompt[:-1], turn])


def check_batch_vs_single(adapter, samples, max_new_tokens: int, tolerance: float) -> Finding:
    """Greedy completions of a left-padded batch (the samples beside a longer neighbour), their log-probs in the
    batch against each sample alone."""
    batch = _device_batch(adapter, [*samples, _longer(samples[0])])
    padded = int((batch.attention_mask[: len(samples)] == 0).sum(dim=1).min())
    out = adapter.generate(batch, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    completion = out.sequences[:, batch.input_ids.shape[1] :]
    ones = torch.ones_like(completion)
    worst = 0.0
    with torch.no_grad():
        together = token_logprobs(completion_logits(adapter, batch, completion, ones), completion)
        for i, sample in enumerate(samples):
            alone = token_logprobs(completion_logits(adapter, _device_batch(adapter, [sample]), completion[i : i + 1],
                                                     ones[i : i + 1]), completion[i : i + 1])
            worst = max(worst, (alone[0] - together[i]).abs().max().item())
    ok = worst <= tolerance
    return Finding("left-padded batch = one by one", ok, f"log-prob difference {worst:.2e} over {len(samples)} samples "
                   f"x {max_new_tokens} tokens, each padded by >= {padded} (tolerance {tolerance:g})")


def position_limit(adapter) -> int | None:
    return getattr(adapter.model.config.get_text_config(), "max_position_embeddings", None)


def prompt_overflow(adapter, sample) -> str | None:
    """Why `sample`'s prompt cannot fit the model's positions, judged from its length alone: a text of more
    characters than the positions times the longest token's characters. Nothing longer is ever tokenized, so the
    pre-checks read at most that many characters of a prompt."""
    limit = position_limit(adapter)
    if limit is None:
        return None
    longest = longest_token_chars(adapter.tokenizer)
    chars = prompt_chars(sample.prompt)
    if chars <= limit * longest:
        return None
    return (f"its prompt text holds {chars} characters, more than the model's {limit} positions can take (a token "
            f"holds at most {longest}): shorten the prompt")


def check_drawn_sample(adapter, sample, max_new_tokens: int) -> None:
    """One sample as the step will encode it: the processor takes its images (aspect ratio, size), its image tokens
    equal its image features, and prompt + images + `max_new_tokens` fit the model's positions. Raises ValueError
    saying what is wrong (the caller names the row)."""
    overflow = prompt_overflow(adapter, sample)
    if overflow:
        raise ValueError(overflow)
    try:
        batch = adapter.encode_prompts([sample.prompt], [sample.images], [sample.videos])
    except ImageTokenMismatch as err:
        raise ValueError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - processors reject inputs with many kinds of errors
        raise ValueError(f"the model's processor rejects it: {type(err).__name__}: {err}") from None
    length = int(batch.attention_mask.sum())
    limit = position_limit(adapter)
    if limit is not None and length + max_new_tokens > limit:
        raise ValueError(too_long(length, max_new_tokens, limit, len(sample.images), len(sample.videos)))


def cheap_checks(adapter, samples, max_new_tokens: int, names: list[str] | None = None) -> list[Finding]:
    """`names`: how messages name each sample (`row_names`). No prompt is tokenized past what the model's positions
    can hold (`prompt_overflow`)."""
    overflow = [f"{names[k] if names else f'sample {k}'}: {why}" for k, s in enumerate(samples)
                if (why := prompt_overflow(adapter, s))]
    if overflow:
        return [Finding("sequence budget", False, "; ".join(overflow)), check_suppressed(adapter)]
    aligned, batch = check_alignment(adapter, samples)
    findings = [aligned, check_suppressed(adapter)]
    if batch is not None:  # the budget needs the samples to encode
        findings.insert(1, check_budget(adapter, batch, max_new_tokens, names))
    return findings


def row_names(dataset, recipe: str, count: int) -> list[str]:
    """How messages name the first `count` samples of a CheckedSource: its file and row (`data.jsonl: row 7`), or,
    for a recipe that makes its own data, the recipe and row."""
    names = [dataset.where(i) for i in range(count)]
    return [name if name != f"row {i}" else f"recipe {recipe}: row {i}" for i, name in enumerate(names)]


def raise_on_failure(findings: list[Finding]) -> None:
    failed = [f for f in findings if not f.ok]
    if failed:
        raise ValueError("pre-flight check failed: " + "; ".join(f"{f.check}: {f.detail}" for f in failed))


def check_disk_space(run_dir: Path, model) -> None:
    """Fail before training when a checkpoint (weights + Adam state) will not fit in the output directory: only when
    what it needs is more than what is free, both written in a unit that shows them."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    adam = sum(p.numel() * 4 * 2 for p in model.parameters() if p.requires_grad)
    need = weights + adam
    free = shutil.disk_usage(run_dir).free
    if free < need:
        needed, free_text = size_pair(need, free)
        raise ResourceLimitReached(errno.ENOSPC, f"{run_dir}: a checkpoint needs about {needed} but only {free_text} "
                                   "are free; free some space, or choose another --output-dir", run_dir)
