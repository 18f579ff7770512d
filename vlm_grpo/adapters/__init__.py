"""Model-family adapters: the contract (base.py), the families (families/, discovered by registry.py) and
what every family shares (prompt batches, feature sharing, module groups, image layout, model specs)."""

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch

__all__ = ["ImageTokenMismatch", "PromptBatch", "VLMAdapter"]
