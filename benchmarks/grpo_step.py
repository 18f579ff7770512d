"""GRPO step benchmark, vlm-grpo vs TRL 1.16 (same as `vlm-grpo bench`; see vlm_grpo/bench/).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/grpo_step.py --model preset:qwen2_5_vl_small
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/grpo_step.py --model preset:hybrid_vit_heavy
    python benchmarks/grpo_step.py --model preset:qwen2_5_vl_3b   # on a GPU
"""

import sys

from vlm_grpo.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
