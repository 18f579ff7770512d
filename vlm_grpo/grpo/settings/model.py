"""The model sections: which model a run loads and how (ModelConfig), and LoRA on it (LoraSettings).

Kept free of heavy imports: the model flags of every model-loading command are generated from these classes
when the command line is built, and `vlm-grpo --help` must not load torch. sections.py assembles them into
TrainConfig with the other sections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting


@dataclass
class ModelConfig:
    name: str = setting("pretrained:shapes-tiny", resume="fixed", help="the model: pretrained:NAME | tiny:FAMILY|TYPE | preset:NAME | "
                        "FAMILY:PATH_OR_HUB_ID | TYPE:PATH | PATH (= --model; a model type without a family file goes "
                        "to the generic adapter)")
    dtype: str = setting("auto", resume="fixed", help="weights dtype of checkpoints and presets", choices=("auto", "float32", "bfloat16", "float16"))
    device: str | None = setting(None, resume="honoured", help="cpu, cuda, cuda:1 ... (None: cuda if available, else cpu)")
    attn_implementation: str | None = setting(None, resume="honoured", help="eager | sdpa | flash_attention_2 (None: the model's default)")
    cache_policy: str = setting("auto", resume="honoured", help="KV cache in generation: auto (probe), cache, no-cache",
                                choices=("auto", "cache", "no-cache"))
    trust_remote_code: bool = setting(False, resume="honoured", help="run code shipped with a checkpoint")
    allow_pickle_weights: bool = setting(False, resume="honoured", help="also load pickled .bin weights (only safetensors otherwise)")
    init_from: str | None = setting(None, resume="fixed", help="a checkpoint to start from (e.g. an SFT run's final/); wins over name")
    module_groups: dict[str, list[str]] = setting(factory=dict, help="regexes per module group replacing the adapter's "
                                                  "(e.g. {vision: [model\\.audio_tower\\.]}), for a model whose "
                                                  "structure the generic adapter cannot group")

    def __post_init__(self) -> None:
        check_fields(self)
        from vlm_grpo.adapters.module_groups import MODULE_GROUPS  # here, not at import: the CLI's flags load light

        for group, patterns in self.module_groups.items():
            if group not in MODULE_GROUPS:
                raise SettingError("module_groups", f"unknown group {group!r}; groups are {', '.join(MODULE_GROUPS)}")
            for pattern in [patterns] if isinstance(patterns, str) else patterns:
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise SettingError("module_groups", f"{group}: {pattern!r} is not a regex ({err})") from None
            self.module_groups[group] = [patterns] if isinstance(patterns, str) else list(patterns)


@dataclass
class LoraSettings:
    RESUME = "fixed"  # the checkpoint's adapter weights are shaped by these: a new run
    r: int = setting(0, help="LoRA rank (0: LoRA off; the freeze policy decides what trains)", at_least=0, at_most=4096)
    alpha: int = setting(16, help="LoRA scaling alpha", above=0, at_most=100_000)
    dropout: float = setting(0.0, help="dropout on the LoRA path", at_least=0.0, below=1.0)
    target_modules: list[str] | None = setting(
        None, help="modules that get LoRA matrices: full names or name suffixes (e.g. merger.mlp.2); "
        "None: the language model's q/k/v/o/gate/up/down projections")
    load_in_4bit: bool = setting(False, help="QLoRA: the base loaded in 4 bit (bitsandbytes NF4, on a GPU or the CPU)")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.target_modules is not None:
            self.target_modules = list(self.target_modules)
        if self.load_in_4bit and self.r == 0:
            raise SettingError("load_in_4bit", "QLoRA trains LoRA matrices on a frozen 4-bit base: set r > 0 (lora.r)")

    @property
    def enabled(self) -> bool:
        return self.r > 0
