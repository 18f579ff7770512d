"""The cache probe: does KV-cached greedy generation see the same model as a full forward?

Three views of one greedy completion on a real image+prompt are compared over several decode
steps: generation with the KV cache, generation without it, and one teacher-forced forward over
prompt+completion (the ground truth the training loss uses). Step 0 comes from the prefill, so a
quirk that loses image information in cached decoding only shows from step 1 on: hence >= 2
steps. A control swaps the image: if that does not move the logits, the probe cannot see image
loss at all and says it is blind. Agreement is judged against the larger of a precision floor and
5% of what swapping the image moves: reduced-precision compute (bf16 autocast) stays "agrees",
while losing the image, which moves logits about as much as swapping it, does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers

from vlm_grpo.compat.probe_image import probe_images
from vlm_grpo.adapters.teacher_forcing import completion_logits

PROBE_PROMPT = "Describe the shapes in the picture and count them."
RELATIVE_TOLERANCE = 0.05


@dataclass
class CacheProbeReport:
    family: str
    transformers_version: str
    steps: int
    tolerance: float
    cached_diff: float  # max |logit diff|, cached generation vs teacher-forced forward
    uncached_diff: float  # same, uncached generation
    control_diff: float  # teacher-forced logits, probe image vs control image

    @property
    def blind(self) -> bool:
        return self.control_diff <= 10 * self.tolerance

    def path_ok(self, use_cache: bool) -> bool:
        diff = self.cached_diff if use_cache else self.uncached_diff
        return diff <= self.tolerance and not self.blind

    @property
    def cache_ok(self) -> bool:
        return self.path_ok(True)

    def rows(self) -> list[tuple[str, float, str]]:
        def verdict(diff: float) -> str:
            return "agrees" if diff <= self.tolerance else "DISAGREES"

        control = "BLIND (image does not change logits)" if self.blind else "image changes logits"
        return [
            ("generate, KV cache", self.cached_diff, verdict(self.cached_diff)),
            ("generate, no cache", self.uncached_diff, verdict(self.uncached_diff)),
            ("control: other image", self.control_diff, control),
        ]

    def table(self) -> str:
        head = f"cache probe: {self.family}, transformers {self.transformers_version}, {self.steps} decode steps, " \
               f"tolerance {self.tolerance:g}"
        lines = [head, f"{'path':<24} {'max |logit diff|':>18}  verdict"]
        lines += [f"{path:<24} {diff:>18.3e}  {verdict}" for path, diff, verdict in self.rows()]
        return "\n".join(lines)


def default_tolerance(model: torch.nn.Module) -> float:
    # fp32 paths agree to ~1e-6; half precision reorders sums enough to move logits by ~1e-2.
    dtype = next(model.parameters()).dtype
    return 1e-3 if dtype == torch.float32 else 1e-1


def probe_cache(adapter, steps: int = 4, tolerance: float | None = None, prompt: str = PROBE_PROMPT) -> CacheProbeReport:
    if steps < 2:
        raise ValueError("the cache probe needs at least 2 decode steps: step 0 comes from the prefill")
    tolerance = default_tolerance(adapter.model) if tolerance is None else tolerance  # the precision floor
    device = next(adapter.model.parameters()).device
    image, control_image = probe_images()
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]

    def encode(img):
        return adapter.encode_prompts([conversation], [[img]]).to(device)

    batch = encode(image)
    diffs, completions = {}, {}
    for use_cache in (True, False):
        out = adapter.generate(
            batch, max_new_tokens=steps, min_new_tokens=steps, use_cache=use_cache, output_logits=True
        )
        completion = out.sequences[:, batch.input_ids.shape[1] :]
        generated = torch.stack(out.logits, dim=1).float()
        with torch.no_grad():
            forward = completion_logits(adapter, batch, completion, torch.ones_like(completion)).float()
        diffs[use_cache] = (generated - forward).abs().max().item()
        completions[use_cache] = (completion, forward)

    completion, forward = completions[False]
    with torch.no_grad():
        other = completion_logits(adapter, encode(control_image), completion, torch.ones_like(completion)).float()
    control = (other - forward).abs().max().item()
    return CacheProbeReport(
        family=adapter.family,
        transformers_version=transformers.__version__,
        steps=steps,
        tolerance=max(tolerance, RELATIVE_TOLERANCE * control),
        cached_diff=diffs[True],
        uncached_diff=diffs[False],
        control_diff=control,
    )
