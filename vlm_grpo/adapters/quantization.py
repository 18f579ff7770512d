"""4-bit loading (QLoRA's base): bitsandbytes NF4 with double quantization, bf16 compute. CUDA only."""

from __future__ import annotations

import torch


def four_bit_config():
    if not torch.cuda.is_available():
        raise RuntimeError("4-bit loading (QLoRA) needs a CUDA GPU and bitsandbytes; none is available here")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
