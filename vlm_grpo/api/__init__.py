"""The Python API, shaped like TRL's: `GRPOTrainer`, `GRPOConfig`, `SFTTrainer`, `SFTConfig`, and the reward
models `RewardModel` (a sequence classifier) and `VLMJudge` (a generative VLM asked about each answer)."""

from vlm_grpo.api.trl_configs import GRPOConfig, SFTConfig
from vlm_grpo.api.trainers import GRPOTrainer, SFTTrainer
from vlm_grpo.grpo.rewards.judge import VLMJudge
from vlm_grpo.grpo.rewards.reward_model import RewardModel

__all__ = ["GRPOConfig", "GRPOTrainer", "RewardModel", "SFTConfig", "SFTTrainer", "VLMJudge"]
