"""GRPO step benchmark: the same model, data and settings through vlm-grpo and through TRL 1.16's GRPOTrainer.

Measured per framework, after warm-up steps: step time, rollout time and rollout tokens/s (completion tokens /
rollout seconds), vision-encoder calls and images per step (a forward pre-hook on the vision tower), and peak
memory (process RSS sampled on CPU, torch.cuda.max_memory_allocated on GPU), and each step's process CPU time.

`engine` (--engine): the rollouts by generate() (transformers) or by vLLM in the process (vlm-grpo's rollout.engine
vllm, TRL's use_vllm colocate); a vLLM run also reports where its step went (engine_parts.py). vLLM on a CPU needs
heads >= 32 wide: `preset:qwen2_5_vl_vllm_tiny` or `preset:qwen2_5_vl_small`.

CPU models are ordinary presets, a few million parameters with 224-px images -> 64 image tokens:
`preset:qwen2_5_vl_small` (ViT 4 x 192 -> LM 4 x 256) and `preset:hybrid_vit_heavy` (Qwen ViT 8 x 256 feeding
a 2-layer, 128-wide LM). GPU: the real-size presets (`preset:qwen2_5_vl_3b`, `preset:hybrid_3b_vit_0_5b`,
`preset:smolvlm_256m`).

`precision` (--precision): both frameworks in fp32, or in bf16 (vlm-grpo's mixed_precision bf16, weights stored in
bf16 with float32 masters; TRL's own bf16=True, its autocast over float32 weights). Default: bf16 on a GPU, fp32 on
a CPU.
"""
