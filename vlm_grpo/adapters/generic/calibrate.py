"""What the generic adapter may assume about a loaded model, measured on it rather than guessed.

On a probe batch (two prompts of different lengths, so one is left-padded, with images of different sizes):
1. encoding: images passed flat or nested per sample (and, for a tiny twin, which placeholder the chat template
   writes), the first way whose image tokens equal the model's image features and whose plain forward runs;
2. positions: the teacher-forced forward must give the logits `generate()` gave; with the model's own positions,
   else with generate()'s (counted from the attention mask), and token-type inputs over the completion 0 (text),
   else 1 (a prefix-LM's suffix); none of these is a refusal;
3. shared image features (encode each image once for its G sequences): used only if the forward with the
   features placed at the image tokens gives the same logits as the plain one;
4. shared prompt prefix (prefill once, expand the KV cache G times): used only if generation from it gives the
   plain generation's tokens and logits;
5. text-only rows: refused with the processor's reason where it will not encode a prompt without an image.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import torch
from PIL import Image, ImageDraw

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.generic.support import GenericUnsupported
from vlm_grpo.adapters.sharing import embed_with_features, generate_shared, image_features, text_side
from vlm_grpo.adapters.teacher_forcing import completion_logits

STEPS = 3
MISMATCH = re.compile(r"holds (\d+) image tokens but its images give (\d+) image features")
log = logging.getLogger(__name__)


@dataclass
class Calibration:
    placeholder: str | None  # the twin's chat-template image part (None: the checkpoint's own template)
    nested_images: bool
    mask_positions: bool
    shares_features: bool
    shares_prefix: bool
    notes: list[str] = field(default_factory=list)


def _picture(width: int, height: int, seed: int) -> Image.Image:
    img = Image.new("RGB", (width, height), (250, 250, 250))
    draw = ImageDraw.Draw(img)
    for k in range(3):
        x, y = (seed * 17 + k * 23) % max(width - 10, 1), (seed * 11 + k * 29) % max(height - 10, 1)
        draw.rectangle([x, y, x + 10, y + 10], fill=((200, 30, 30), (30, 30, 200), (30, 160, 30))[(seed + k) % 3])
    return img


def probe_inputs():
    """Two prompts of different lengths; the second shows two images side by side (where images without delimiters
    between them would run together)."""
    texts = ["How many red squares are in the picture? Answer with a number.", "Which is wider?"]
    images = [[_picture(112, 84, 1)], [_picture(56, 56, 2), _picture(84, 56, 3)]]
    conversations = [[{"role": "user", "content": [{"type": "image"}] * len(pics) + [{"type": "text", "text": t}]}]
                     for t, pics in zip(texts, images)]
    return conversations, images


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    if a.shape != b.shape or not torch.isfinite(a).all():
        return False
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return (a.float() - b.float()).abs().max().item() <= tol * max(1.0, b.float().abs().max().item())


def placeholders(processor) -> list[str]:
    """Image parts a chat template may write: the image token, wrapped in start/end tokens (the processor's, or the
    tokenizer's tokens for the config's start/end ids), or the start-of-image token alone (processors expanding it)."""
    def text(name):
        for owner in (processor, processor.tokenizer):  # the processor's own, else the tokenizer's special token
            value = getattr(owner, name, None)
            if isinstance(value, str) and value:
                return value
        return None

    image = text("image_token") or "<image>"
    out = [image]
    for start, end in (("vision_start_token", "vision_end_token"), ("image_start_token", "image_end_token"),
                       ("start_of_img_token", "end_of_img_token"), ("boi_token", "eoi_token")):
        if text(start) and text(end):
            out.append(text(start) + image + text(end))
    out += [t for t in (text("boi_token"), text("start_of_image_token"), text("image_start_token")) if t]
    return list(dict.fromkeys(out + ["<image>"]))  # the literal most processors replace in the text


def _encode(adapter, conversations, images, twin: bool) -> tuple[PromptBatch, str | None]:
    try:
        return _encode_with(adapter, conversations, images, placeholders(adapter.processor) if twin else [None])
    except GenericUnsupported as err:
        counts = MISMATCH.search(str(err)) or re.search(r"\((\d+) image tokens in a probe prompt, (\d+) features", str(err))
        tokens, features = (int(counts.group(1)), int(counts.group(2))) if counts else (0, 0)
        if not twin or tokens != 1 or features <= 1:
            raise
        # a processor that writes one image token whatever the features (PP-Chart2Table): its checkpoints' chat
        # templates write them all, so the twin's writes the model's count (one probe image per prompt first)
        image = placeholders(adapter.processor)[0]
        return _encode_with(adapter, conversations, images, [image * features])


def _encode_with(adapter, conversations, images, candidates) -> tuple[PromptBatch, str | None]:
    first: Exception | None = None
    param = next(adapter.model.parameters())
    for placeholder in candidates:
        if placeholder is not None:
            template = chatml_template(placeholder)
            adapter.processor.chat_template = adapter.tokenizer.chat_template = template
        for nested in (False, True):
            adapter.nested_images = nested
            try:
                batch = adapter.encode_prompts(conversations, images).to(param.device, dtype=param.dtype)
                adapter.model(**adapter.model_inputs(batch))  # the model takes it (image runs told apart, positions built)
                return batch, placeholder
            except GenericUnsupported:
                raise
            except Exception as err:  # the processor refuses this layout, or its tokens disagree with the features
                if first is None or (isinstance(err, ImageTokenMismatch) and not isinstance(first, ImageTokenMismatch)):
                    first = err
                log.debug("calibrate %s [%s] nested=%s: %s: %s", adapter.family, placeholder, nested,
                          type(err).__name__, err)
    counts = MISMATCH.search(str(first)) if isinstance(first, ImageTokenMismatch) else None
    if counts:
        raise GenericUnsupported(f"{adapter.family}: the processor's image tokens do not match the model's image "
                                 f"features ({counts.group(1)} image tokens in a probe prompt, {counts.group(2)} "
                                 "features from get_image_features)")
    raise GenericUnsupported(f"{adapter.family}: the probe prompts do not encode and run through the model "
                             f"({type(first).__name__}: {(str(first).splitlines() or [''])[0][:160]})")


def _greedy(adapter, batch: PromptBatch, use_cache: bool):
    out = adapter.generate(batch, max_new_tokens=STEPS, min_new_tokens=STEPS, use_cache=use_cache, output_logits=True)
    return out.sequences[:, batch.input_ids.shape[1]:], torch.stack(out.logits, dim=1)


def calibrate(adapter) -> Calibration:
    try:
        return _calibrate(adapter)
    except GenericUnsupported:
        raise
    except Exception as err:  # the model failed on the probe in a way no rule covers: named, in one line
        raise GenericUnsupported(f"{adapter.family}: calibration failed ({type(err).__name__}: "
                                 f"{(str(err).splitlines() or [''])[0][:160]})") from err


def _calibrate(adapter) -> Calibration:
    twin = adapter.source.startswith("tiny:")
    param = next(adapter.model.parameters())
    conversations, images = probe_inputs()
    notes: list[str] = []
    _text_rows(adapter, notes)
    with torch.no_grad():
        batch, placeholder = _encode(adapter, conversations, images, twin)
        completion, logits = _greedy(adapter, batch, use_cache=False)
        ones = torch.ones_like(completion)
        forced = None
        fills = (0, 1) if batch.token_keys else (0,)  # token types over a completion: text (0), or a suffix (1)
        for mask, fill in [(m, f) for m in (False, True) for f in fills]:
            adapter.mask_positions, adapter.completion_token_type = mask, fill
            forced = completion_logits(adapter, batch, completion, ones)
            if _close(forced, logits, param.dtype):
                break
        else:
            diff = (forced.float() - logits.float()).abs().max().item()
            raise GenericUnsupported(f"{adapter.family}: a teacher-forced forward does not give the logits generate() "
                                     f"gave (max |diff| {diff:.3g}) with either position rule")
        shares_features = _shares_features(adapter, batch, completion, forced, param.dtype, notes)
        adapter.shares_features = shares_features
        adapter.shares_prefix = shares_features and _shares_prefix(adapter, batch, param.dtype, notes)
    return Calibration(placeholder, adapter.nested_images, adapter.mask_positions, adapter.shares_features,
                       adapter.shares_prefix, notes)


def _text_rows(adapter, notes) -> None:
    """Text-only rows are refused, in the processor's words, where it will not encode a prompt without an image."""
    try:
        adapter._process(["Say something about squares."], [[]])
    except Exception as err:
        adapter.text_rows = "refused"
        adapter.text_rows_reason = (f"its processor needs an image in every prompt: {type(err).__name__}: "
                                    f"{(str(err).splitlines() or [''])[0][:120]}")
        notes.append(f"text-only rows refused: {adapter.text_rows_reason}")


def _shares_features(adapter, batch, completion, plain, dtype, notes) -> bool:
    ones = torch.ones_like(completion)
    try:
        features = image_features(adapter, batch)
    except Exception as err:  # the feature function's output is not per-token features
        notes.append(f"shared features off: get_image_features gave no per-token features ({type(err).__name__})")
        return False
    text = text_side(adapter, batch)
    kept = [k for k in text.mm]
    for keys in ((), tuple(batch.token_keys), tuple(kept)):
        adapter.embedding_forward_keys = keys
        try:
            inputs = embed_with_features(adapter, text, features, completion, ones)
            got = completion_logits(adapter, batch, completion, ones, inputs=inputs)
        except Exception:  # the forward does not take these beside inputs_embeds
            continue
        if _close(got, plain, dtype):
            return True
    adapter.embedding_forward_keys = ()
    notes.append("shared features off: features placed at the image tokens do not reproduce the plain forward")
    return False


def _shares_prefix(adapter, batch, dtype, notes) -> bool:
    settings = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, use_cache=True, output_logits=True)
    try:
        adapter.shares_prefix = True
        shared = generate_shared(adapter, batch, 1, **settings).output
        plain = adapter.generate(batch, **settings)
    except Exception as err:
        notes.append(f"shared prefix off: generation from a prefilled prefix failed ({type(err).__name__})")
        return False
    same = torch.equal(shared.sequences, plain.sequences) and _close(
        torch.stack(shared.logits, dim=1), torch.stack(plain.logits, dim=1), dtype)
    if not same:
        notes.append("shared prefix off: generation from a prefilled prefix differs from plain generation")
    return same
