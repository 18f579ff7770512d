"""`VLMAdapter`, the class a model family subclasses: the contract (contract.py: what a family declares, implements
and may override) with the machinery every family shares on top of it:
- construction.py: an adapter from a model and processor, a checkpoint, or the family's twin; saving;
- prompt_encoding.py: chat messages + images/videos -> a checked PromptBatch;
- model_calls.py: the kwargs of forwards (teacher forcing too) and of `generate`;
- parameter_groups.py: module groups, training sub-groups, the routers' auxiliary-loss weight.
"""

from __future__ import annotations

from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.adapters.construction import Construction
from vlm_grpo.adapters.contract import AdapterContract
from vlm_grpo.adapters.image_routes import TextRowsNotSupported
from vlm_grpo.adapters.model_calls import ModelCalls
from vlm_grpo.adapters.parameter_groups import ParameterGroups
from vlm_grpo.adapters.prompt_encoding import Conversation, PromptEncoding, VideoNotSupported

__all__ = ["Conversation", "ImageTokenMismatch", "TextRowsNotSupported", "VLMAdapter", "VideoNotSupported"]


class VLMAdapter(Construction, PromptEncoding, ModelCalls, ParameterGroups, AdapterContract):
    """One model family's adapter (subclass it in adapters/families/; the registry finds it)."""
