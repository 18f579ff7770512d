"""The text-only causal LM's twin and presets: a Qwen2 causal LM, shrunk, with a locally built ChatML tokenizer
(text parts only), and Qwen2.5-0.5B-Instruct's sizes."""

from __future__ import annotations

import torch

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded_model

# Qwen2's ChatML turns, text parts only
CHATML_TEXT = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
TINY = Architecture(vision={}, text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                         tie_word_embeddings=False),
                    note="a Qwen2 causal LM, shrunk")
QWEN2_5_0_5B = Architecture(vision={}, text=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                                 num_attention_heads=14, num_key_value_heads=2,
                                                 max_position_embeddings=32768, rope_theta=1e6,
                                                 tie_word_embeddings=True),
                            vocab_size=151936, note="Qwen/Qwen2.5-0.5B-Instruct")


class CausalLMTwin:
    """Mixed into CausalLMAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"qwen2_5_0_5b": QWEN2_5_0_5B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

        tokenizer = build_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], chat_template=CHATML_TEXT,
                                    eos_token="<|im_end|>", pad_token="<|endoftext|>")
        config = Qwen2Config(vocab_size=arch.vocab_size or len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **arch.text)
        model = seeded_model(Qwen2ForCausalLM, config, seed, dtype)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        return cls(model, tokenizer, source=f"tiny:{cls.family}")
