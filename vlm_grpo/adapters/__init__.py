"""Model-family adapters. Importing this package registers every built-in family."""

from vlm_grpo.adapters.base import ImageTokenMismatch, VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.registry import FAMILIES, MODEL_TYPES, load_adapter
from vlm_grpo.adapters import hybrid, idefics3, internvl, qwen2_5_vl, smolvlm  # noqa: F401  (registers)

__all__ = ["FAMILIES", "MODEL_TYPES", "ImageTokenMismatch", "PromptBatch", "VLMAdapter", "load_adapter"]
