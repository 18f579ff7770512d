"""vlm-grpo: GRPO for vision-language models.

    from vlm_grpo import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer, RewardModel, VLMJudge

The names are loaded on first use (vlm_grpo/api), so `import vlm_grpo` and `vlm-grpo --help` stay light.
"""

import logging

from vlm_grpo.version import __version__

# bitsandbytes (imported by peft whenever it is installed) warns on every import, on CPUs with AVX512-BF16, that an
# optional faster 4-bit kernel package is absent; its own CPU kernels run instead, so the warning is noise on stderr
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

API = ("GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "RewardModel", "VLMJudge")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    if name in API:
        from vlm_grpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'vlm_grpo' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API])
