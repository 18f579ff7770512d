"""Text-only causal language models: any `AutoModelForCausalLM` type (Qwen2, Llama, Mistral, Qwen3-MoE ...).

The same loop and recipes train them; a prompt carries no images, so the module groups `vision` and `projector`
are empty, no token is a placeholder, and every multimodal hook has nothing to do. A row with an image is refused
naming the sample (a recipe with images needs a vision-language model). It is also every VLM experiment's
text-only baseline: the same recipe without the picture.

The processor is the model's tokenizer. A prompt is written with the tokenizer's chat template; a tokenizer with
none (a base model) gets the messages' text as it stands, which is what TRL feeds a standard-format prompt.
"""

from __future__ import annotations

from typing import Any, ClassVar

from PIL import Image
from transformers import PreTrainedModel

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.causal_lm import CausalLMTwin

NO_TOKEN = -1  # the placeholder id of a model without images: equal to no token id


def causal_lm_types() -> set[str]:
    """Model types transformers can load as a causal LM, less those with an image-text-to-text class."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


class CausalLMAdapter(CausalLMTwin, VLMAdapter):
    family = "causal_lm"
    model_types = ()  # every causal-LM type no other family claims (`serves_model_type`)
    model_class = PreTrainedModel  # any causal LM's class; `load` goes through AutoModelForCausalLM
    model_types_note = "any causal-LM type"
    model_class_note = "AutoModelForCausalLM"
    reads_images: ClassVar[bool] = False
    # every parameter is the language model's, except the output head
    module_layout = ModuleLayout(vision=(), projector=(), language=(r"(?!lm_head\.)",), head=(r"lm_head\.",))
    shares_features = False  # no image features to share
    text_rows = "mixed"

    @classmethod
    def serves_model_type(cls, model_type: str, auto_classes=()) -> bool:
        """Any causal-LM type of transformers, and a checkpoint whose own code provides an AutoModelForCausalLM
        (loaded only with trust_remote_code)."""
        return model_type in causal_lm_types() or "AutoModelForCausalLM" in auto_classes

    @classmethod
    def checkpoint_class(cls) -> type:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    @classmethod
    def load_processor(cls, path: str, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)  # padded left by __init__

    def __init__(self, model, processor, source: str = "", use_cache: bool | None = None):
        processor = getattr(processor, "tokenizer", processor)  # a processor's tokenizer is what a text model reads
        processor.padding_side = "left"  # prompts end where generation starts
        if processor.pad_token_id is None:  # TRL's rule: a tokenizer without one pads with its end-of-sequence token
            processor.pad_token = processor.eos_token
        super().__init__(model, processor, source=source, use_cache=use_cache)

    # ---------------------------------------------------------------- tokens
    @property
    def tokenizer(self):
        return self.processor

    @property
    def image_token_id(self) -> int:
        return NO_TOKEN

    def suppressed_token_ids(self) -> list[int]:
        return []  # nothing the model could emit breaks the training forward

    # ---------------------------------------------------------------- encoding
    def check_text_rows(self, images) -> None:
        for i, sample in enumerate(images):
            if sample:
                raise ImageTokenMismatch(f"sample {i}: {len(sample)} image(s), but {self.family} is a text-only model "
                                         "(it has no vision tower); use a vision-language model for this data")

    def render_prompt(self, messages: list[dict], **options) -> str:
        if self.processor.chat_template:
            return super().render_prompt(messages, **options)
        return "".join(_text_of(m["content"]) for m in messages)

    def _run_processor(self, texts, images, videos=None, **text_options):
        return self.processor(text=list(texts), padding=True, return_tensors="pt", **text_options)

    def _to_batch(self, features: Any, images: list[list[Image.Image]], videos=None) -> PromptBatch:
        return PromptBatch(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                           image_spans=[[] for _ in range(features["input_ids"].shape[0])])

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        return [0] * len(batch)

    def image_token_positions(self, batch, sample, image, image_size=None):
        raise ValueError(f"{self.family}: a text-only model has no image tokens")

    def layout_facts(self, batch, sample, image):
        raise ValueError(f"{self.family}: a text-only model has no image layout")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if part.get("type") == "text")
