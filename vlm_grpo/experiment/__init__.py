"""Multi-stage experiments: compose -> align -> SFT -> GRPO -> evaluate, each stage resumable, from one config file
(`vlm-grpo experiment CONFIG`; examples/smollm2_learns_to_see.yaml)."""
