"""Model-family adapters: VLMAdapter (base.py: the contract of contract.py + the machinery every family shares), the
families (families/, discovered by registry.py; each one's tiny twin and presets in twins/) and what every family
shares (prompt batches, feature sharing, module groups, image layout, model specs)."""

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch

__all__ = ["ImageTokenMismatch", "PromptBatch", "VLMAdapter"]
