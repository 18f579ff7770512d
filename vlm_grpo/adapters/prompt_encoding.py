"""Prompt encoding every family shares: chat messages and each sample's images and videos -> one left-padded
PromptBatch through the family's processor hooks (`_run_processor`, `_to_batch`), checked for image-token alignment."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from PIL import Image

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch, visual_parts
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
                       tools: Sequence[list | None] | None = None) -> PromptBatch:
        """Chat messages + each sample's images (and videos: a Video or a list of frames each) -> one left-padded
        PromptBatch, checked for alignment. Image and video parts of the messages take them in order.
        `tools`: per sample, the tools (functions or JSON schemas) its chat template describes to the model."""
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
        if not any(videos):  # the image-only path every family has
            batch = self._to_batch(self._run_processor(texts, images), images)
        else:
            videos = [[prepare_sample_video(v, i) for v in sample] for i, sample in enumerate(videos)]
            batch = self._to_batch(self._run_processor(texts, images, videos=videos), images, videos=videos)
            batch.image_spans, batch.video_spans = self._visual_spans(batch, kinds, videos)
        self.check_alignment(batch)
        return batch

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
