"""Prompt encoding every family shares: chat messages and each sample's images and videos -> one left-padded
PromptBatch through the family's processor hooks (`_run_processor`, `_to_batch`), checked for image-token alignment."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch
from PIL import Image

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch, combine_rows, visual_parts
from vlm_grpo.adapters.prompt_cache import PromptCache, processor_fingerprint, row_key
from vlm_grpo.adapters.image_layout import token_runs
from vlm_grpo.images import prepare_sample_image
from vlm_grpo.videos import Video, prepare_sample_video

Conversation = list[dict[str, Any]]


class VideoNotSupported(ValueError):
    """A video for a family whose model cannot take one."""


class PromptEncoding:
    """Mixed into VLMAdapter: the tokenizer, the image placeholder, prompts -> checked PromptBatch."""

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @property
    def image_token_id(self) -> int:
        """The placeholder id that image features replace in the embedding sequence."""
        return self.model.config.image_token_id

    def encode_prompts(self, conversations: Sequence[Conversation], images: Sequence[Sequence[Image.Image]],
                       videos: Sequence[Sequence[Video | list[Image.Image]]] | None = None,
                       tools: Sequence[list | None] | None = None, cache: PromptCache | None = None) -> PromptBatch:
        """Chat messages + each sample's images (and videos: a Video or a list of frames each) -> one left-padded
        PromptBatch, checked for alignment. Image and video parts of the messages take them in order.
        `tools`: per sample, the tools (functions or JSON schemas) its chat template describes to the model.
        `cache`: rows encoded before are taken from it (prompt_cache.py; rows with videos are always encoded)."""
        videos = [[] for _ in conversations] if videos is None else videos
        if not len(conversations) == len(images) == len(videos):
            raise ValueError(f"{len(conversations)} conversations but {len(images)} image and {len(videos)} video lists")
        kinds = [visual_parts(conv) for conv in conversations]
        for i, (parts, sample_images, sample_videos) in enumerate(zip(kinds, images, videos)):
            if parts.count("image") != len(sample_images):
                raise ImageTokenMismatch(f"sample {i}: the prompt has {parts.count('image')} image parts but "
                                         f"{len(sample_images)} images")
            if parts.count("video") != len(sample_videos):
                raise ImageTokenMismatch(f"sample {i}: the prompt has {parts.count('video')} video parts but "
                                         f"{len(sample_videos)} videos")
            if sample_videos and not self.takes_video:
                raise VideoNotSupported(f"sample {i}: {self.family} cannot take video (its model reads images only); "
                                        "use a family that reads video (vlm-grpo families)")
        self.check_text_rows(images)
        texts = [self.render_prompt(list(conv), **getattr(self, "chat_template_kwargs", {}), **({"tools": list(t)} if t else {}))
                 for conv, t in zip(conversations, tools or [None] * len(conversations))]
        images = [[prepare_sample_image(img, i) for img in sample] for i, sample in enumerate(images)]
        if not any(videos) and cache is not None and cache.enabled and self.joins_encoded_rows:
            batch = self._encode_rows(texts, images, cache)
        elif not any(videos):  # the image-only path every family has
            batch = self._to_batch(self._run_processor(texts, images), images)
        else:
            videos = [[prepare_sample_video(v, i) for v in sample] for i, sample in enumerate(videos)]
            batch = self._to_batch(self._run_processor(texts, images, videos=videos), images, videos=videos)
            batch.image_spans, batch.video_spans = self._visual_spans(batch, kinds, videos)
        self.check_alignment(batch)
        return batch

    def _encode_rows(self, texts: list[str], images: list[list[Image.Image]], cache: PromptCache) -> PromptBatch:
        """Each row from `cache` by its content, or encoded alone and kept; then joined as the processor would have
        padded them together (the contract suite checks the two are equal, tensor for tensor). Rows the family
        cannot join exactly (`can_join`) are encoded together, as without a cache."""
        fingerprint = processor_fingerprint(self)
        rows: list[PromptBatch] = []
        encoded: dict[bytes, PromptBatch] = {}  # a row repeated within the call is encoded once, cache kept or not
        for text, sample in zip(texts, images):
            key = row_key(fingerprint, text, sample)
            row = encoded.get(key) or cache.get(key)
            if row is None:
                row = self._to_batch(self._run_processor([text], [sample]), [sample])
                cache.put(key, row)
            encoded[key] = row
            rows.append(row)
        if not self.can_join(rows):  # e.g. images of other sizes, padded to the largest: the processor pads them
            cache.joins = False  # this run's rows may differ again: encoded together from now on, once each
            cache.clear()
            return self._to_batch(self._run_processor(texts, images), images)
        return self.join_rows(rows)

    def join_rows(self, rows: Sequence[PromptBatch]) -> PromptBatch:
        """One-row PromptBatches (image-only, as `_to_batch` gives them) -> one batch padded on the tokenizer's side,
        the family's tensors joined by `combine_images`. New tensors throughout: the rows are never aliased."""
        width = max(row.input_ids.shape[1] for row in rows)
        left = self.tokenizer.padding_side == "left"
        first = rows[0]
        ids = first.input_ids.new_full((len(rows), width), self.tokenizer.pad_token_id)
        mask = first.attention_mask.new_zeros((len(rows), width))
        token_keys = tuple(dict.fromkeys(k for row in rows for k in row.token_keys))
        like = {k: next(row.mm[k] for row in rows if k in row.mm) for k in token_keys}
        types = {k: t.new_zeros((len(rows), width, *t.shape[2:])) for k, t in like.items()}
        spans = []
        for i, row in enumerate(rows):
            length = row.input_ids.shape[1]
            shift = width - length if left else 0
            ids[i, shift:shift + length] = row.input_ids[0]
            mask[i, shift:shift + length] = row.attention_mask[0]
            for key in token_keys:
                if key in row.mm:
                    types[key][i, shift:shift + length] = row.mm[key][0]
            spans.append([(start + shift, end + shift) for start, end in row.image_spans[0]])
        sources = [[(row, 0)] for row in rows]
        image_keys = [k for k in dict.fromkeys(k for row in rows for k in row.mm) if k not in token_keys]
        mm, mm_rows = self.combine_images(sources, image_keys)
        mm = {k: v.clone() if any(v is row.mm.get(k) for row in rows) else v for k, v in mm.items()}
        for key in token_keys:
            mm[key], mm_rows[key] = types[key], [1] * len(rows)
        as_mm = [[(replace(row, mm=row.meta, mm_rows=row.meta_rows), 0)] for row in rows]
        meta, meta_rows = combine_rows(as_mm, list(dict.fromkeys(k for row in rows for k in row.meta)))
        return PromptBatch(input_ids=ids, attention_mask=mask, mm=mm, mm_rows=mm_rows, image_spans=spans,
                           token_keys=token_keys, meta=meta, meta_rows=meta_rows)

    def render_prompt(self, messages: Conversation, **options: Any) -> str:  # up to the assistant's answer
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **options)

    def encode_turns(self, texts: Sequence[str], images: Sequence[Sequence[Image.Image]]) -> PromptBatch:
        """Text continuing conversations (a tool turn, up to the next assistant header) with its images, one sample
        each: encoded like prompts without the tokenizer's special tokens, left-padded, checked for alignment."""
        images = [[prepare_sample_image(img, i) for img in sample] for i, sample in enumerate(images)]
        batch = self._to_batch(self._run_processor(list(texts), images, add_special_tokens=False), images)
        self.check_alignment(batch)
        return batch

    def _batch(self, features: Any, images: list[list[Image.Image]], mm: dict[str, torch.Tensor],
               mm_rows: dict[str, list[int]], token_keys: tuple[str, ...] = (), videos: list[list[Video]] | None = None
               ) -> PromptBatch:
        """The PromptBatch a `_to_batch` ends with: the family's `mm` tensors plus the token side. With videos the
        spans are left to `encode_prompts`, which knows the order of image and video parts."""
        input_ids = features["input_ids"]
        return PromptBatch(
            input_ids=input_ids,
            attention_mask=features["attention_mask"],
            mm=mm,
            mm_rows=mm_rows,
            image_spans=[] if videos and any(videos) else self.image_token_spans(input_ids, [len(s) for s in images]),
            token_keys=token_keys,
        )

    def check_alignment(self, batch: PromptBatch) -> None:
        tokens = (batch.input_ids == self.image_token_id).sum(dim=1).tolist()
        for i, (n_tok, n_feat) in enumerate(zip(tokens, self.feature_counts(batch))):
            if n_tok != n_feat:
                raise ImageTokenMismatch(
                    f"sample {i}: the prompt holds {n_tok} image tokens but its images give {n_feat} "
                    f"image features ({self.family}); was the prompt tokenized with another processor, "
                    "or did a completion contain an image placeholder?"
                )
        if self.video_token_id == self.image_token_id:  # frames are images: counted above
            return
        tokens = (batch.input_ids == self.video_token_id).sum(dim=1).tolist()
        for i, (n_tok, n_feat) in enumerate(zip(tokens, self.video_feature_counts(batch))):
            if n_tok != n_feat:
                raise ImageTokenMismatch(f"sample {i}: the prompt holds {n_tok} video tokens but its videos give "
                                         f"{n_feat} video features ({self.family})")

    def image_token_spans(self, input_ids: torch.Tensor, images_per_sample: list[int]) -> list[list[tuple[int, int]]]:
        """Runs of image tokens, merged per image by the family's own layout (default: one run per image)."""
        return [self._group_runs(token_runs(row, self.image_token_id), n)
                for row, n in zip(input_ids.tolist(), images_per_sample)]

    def image_token_indices(self, batch: PromptBatch, sample: int, image: int) -> list[int]:
        """Positions in `batch.input_ids[sample]` of the image's placeholder tokens (delimiters skipped)."""
        start, end = batch.image_spans[sample][image]
        ids = batch.input_ids[sample, start:end].tolist()
        return [start + k for k, tok in enumerate(ids) if tok == self.image_token_id]
