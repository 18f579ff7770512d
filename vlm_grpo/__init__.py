"""vlm-grpo: GRPO for vision-language models.

    from vlm_grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer, RewardModel, VLMJudge

The names are loaded on first use (vlm_grpo/api), so `import vlm_grpo` and `vlm-grpo --help` stay light.
"""

from vlm_grpo.version import __version__

API = ("GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "RewardModel", "VLMJudge")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    if name in API:
        from vlm_grpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'vlm_grpo' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API])
