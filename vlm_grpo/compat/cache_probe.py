"""The cache probe: does KV-cached greedy generation see the same model as a full forward?

Three views of one greedy completion on a real image+prompt are compared over `steps` decode steps (16 by
default): generation with the KV cache, generation without it, and one teacher-forced forward over
prompt+completion (the ground truth the training loss uses). Step 0 comes from the prefill, so a fault in
cached decoding only shows from step 1 on, and some only after a few steps.

What counts as agreement is measured, not assumed: the same forward is run twice, alone and left-padded
inside a batch, and the difference is the forward's own numerical noise. A path agrees when its logits stay
within NOISE_MULTIPLE times that noise (never below a precision floor: 1e-5 in float32, 2e-2 in half
precision) and its greedy tokens are the ones the forward prefers (near ties within the tolerance excepted).
Non-finite logits are a verdict of their own. A control swaps the image: if that does not move the logits
to at least twice the tolerance, the probe cannot see image loss at all and says it is blind.

`media="video"` runs the same probe on a short clip instead of an image (families that take video): the control
swaps the clip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers

from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.compat.probe_image import probe_clips, probe_images
from vlm_grpo.recipes.base import user_turn

PROBE_PROMPT = "Describe the shapes in the picture and count them."
PADDING_PROMPT = "Look at this other picture closely. Which colours and shapes are in it, and how many of each?"
MEDIA = ("image", "video")
STEPS = 16


def probe_steps(max_new_tokens: int) -> int:
    """Decode steps a run's probe compares: STEPS, or fewer when completions are shorter (never under 2)."""
    return max(2, min(STEPS, max_new_tokens))
NOISE_MULTIPLE = 10


@dataclass
class CacheProbeReport:
    family: str
    transformers_version: str
    steps: int
    tolerance: float  # max(NOISE_MULTIPLE x noise, precision floor)
    cached_diff: float  # max |logit diff|, cached generation vs teacher-forced forward
    uncached_diff: float  # same, uncached generation
    control_diff: float  # teacher-forced logits, probe image vs control image
    noise: float = 0.0  # the forward alone vs left-padded in a batch
    cached_tokens_ok: bool = True  # greedy tokens = the forward's choice (near ties excepted)
    uncached_tokens_ok: bool = True
    finite: bool = True  # every logit of every view is finite
    media: str = "image"  # what the probe prompt shows: an image or a video

    @property
    def blind(self) -> bool:
        return self.finite and self.control_diff <= 2 * self.tolerance

    def path_ok(self, use_cache: bool) -> bool:
        diff, tokens_ok = (self.cached_diff, self.cached_tokens_ok) if use_cache else (self.uncached_diff, self.uncached_tokens_ok)
        return self.finite and diff <= self.tolerance and tokens_ok and not self.blind

    @property
    def cache_ok(self) -> bool:
        return self.path_ok(True)

    def _verdict(self, diff: float, tokens_ok: bool) -> str:
        if not self.finite:
            return "NON-FINITE logits"
        if diff > self.tolerance:
            return "DISAGREES"
        return "agrees" if tokens_ok else "DISAGREES (other tokens)"

    def rows(self) -> list[tuple[str, float, str]]:
        control = "non-finite" if not self.finite else (
            f"BLIND ({self.media} does not change logits)" if self.blind else f"{self.media} changes logits")
        return [
            ("generate, KV cache", self.cached_diff, self._verdict(self.cached_diff, self.cached_tokens_ok)),
            ("generate, no cache", self.uncached_diff, self._verdict(self.uncached_diff, self.uncached_tokens_ok)),
            ("noise floor (padding)", self.noise, f"tolerance {self.tolerance:.3g}"),
            (f"control: other {self.media}", self.control_diff, control),
        ]

    def table(self) -> str:
        media = "" if self.media == "image" else f" ({self.media} prompt)"
        head = f"cache probe: {self.family}{media}, transformers {self.transformers_version}, {self.steps} decode steps, " \
               f"tolerance {self.tolerance:g}"
        lines = [head, f"{'path':<24} {'max |logit diff|':>18}  verdict"]
        lines += [f"{path:<24} {diff:>18.3e}  {verdict}" for path, diff, verdict in self.rows()]
        return "\n".join(lines)


def precision_floor(model: torch.nn.Module) -> float:
    # float32 paths agree to ~1e-7; half precision reorders sums enough to move logits by ~1e-2.
    dtype = next(model.parameters()).dtype
    return 1e-5 if dtype == torch.float32 else 2e-2


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _tokens_ok(tokens: torch.Tensor, forward: torch.Tensor, suppressed: list[int], tolerance: float) -> bool:
    """Whether each greedy token is the forward's choice, or within `tolerance` of it (a near tie)."""
    allowed = forward.clone()
    allowed[..., suppressed] = float("-inf")
    best = allowed.max(dim=-1).values
    chosen = allowed.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return bool(((best - chosen) <= tolerance).all())


def probe_inputs(adapter, media: str):
    """(probe item, control item, encode(prompts, items) -> PromptBatch) for images or videos."""
    if media == "image":
        first, control = probe_images()
        return first, control, lambda prompts, items: adapter.encode_prompts([user_turn(p) for p in prompts],
                                                                             [[x] for x in items])
    if media != "video":
        raise ValueError(f"probe media must be one of {', '.join(MEDIA)}, not {media!r}")
    if not adapter.takes_video:
        raise ValueError(f"{adapter.family} cannot take video: no video probe")
    first, control = probe_clips()
    return first, control, lambda prompts, items: adapter.encode_prompts(
        [user_turn(p, n_images=0, n_videos=1) for p in prompts], [[] for _ in items], [[x] for x in items])


def probe_cache(adapter, steps: int = STEPS, tolerance: float | None = None, prompt: str = PROBE_PROMPT,
                media: str = "image") -> CacheProbeReport:
    if steps < 2:
        raise ValueError("the cache probe needs at least 2 decode steps: step 0 comes from the prefill")
    device = next(adapter.model.parameters()).device
    image, control_image, encode = probe_inputs(adapter, media)
    batch = encode([prompt], [image]).to(device)
    views = {}
    for use_cache in (True, False):
        out = adapter.generate(batch, max_new_tokens=steps, min_new_tokens=steps, use_cache=use_cache, output_logits=True)
        completion = out.sequences[:, batch.input_ids.shape[1] :]
        with torch.no_grad():
            forward = completion_logits(adapter, batch, completion, torch.ones_like(completion)).float()
        views[use_cache] = (completion, torch.stack(out.logits, dim=1).float(), forward)

    completion, _, forward = views[False]
    ones = torch.ones_like(completion)
    padded_batch = encode([PADDING_PROMPT, prompt], [control_image, image])
    with torch.no_grad():
        other = completion_logits(adapter, encode([prompt], [control_image]).to(device), completion, ones).float()
        padded = completion_logits(adapter, padded_batch.to(device), completion.repeat(2, 1), ones.repeat(2, 1)).float()[1:]
    finite = all(bool(torch.isfinite(t).all()) for view in views.values() for t in view[1:]) and \
        bool(torch.isfinite(other).all() and torch.isfinite(padded).all())
    noise = _max_diff(padded, forward) if finite else float("nan")
    if tolerance is None:
        floor = precision_floor(adapter.model)
        tolerance = max(NOISE_MULTIPLE * noise, floor) if finite else floor
    suppressed = adapter.suppressed_token_ids() + adapter.eos_token_ids  # min_new_tokens bars EOS too
    diffs = {k: _max_diff(gen, fwd) for k, (_, gen, fwd) in views.items()}
    tokens = {k: _tokens_ok(c, fwd, suppressed, tolerance) for k, (c, _, fwd) in views.items()}
    return CacheProbeReport(
        family=adapter.family,
        transformers_version=transformers.__version__,
        steps=steps,
        tolerance=tolerance,
        cached_diff=diffs[True],
        uncached_diff=diffs[False],
        control_diff=_max_diff(other, forward),
        noise=noise,
        cached_tokens_ok=tokens[True],
        uncached_tokens_ok=tokens[False],
        finite=finite,
        media=media,
    )
