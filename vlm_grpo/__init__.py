"""vlm-grpo: GRPO for vision-language models."""

__version__ = "0.1.0"
