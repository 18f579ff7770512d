"""`GRPOConfig` and `SFTConfig`: the run settings as TRL users write them, `GRPOConfig(output_dir=..., beta=...)`.

Every keyword is a setting `vlm-grpo train --help` lists: a field name unique across sections (`learning_rate`,
`num_generations`), a section as a mapping (`lora={"r": 8}`, `eval={"before_after": True}`), or TRL's name where
it means the same (`max_completion_length`, `bf16`, `save_steps` ...). They go through the parser the command line
and YAML files use (grpo/settings/sources.py), so every value is checked when the config is built, TRL names with
no same-meaning setting are refused together in one message, and `config="run.yaml"` reads a file underneath the
keywords. Every field of TRL's own GRPOConfig is taken as api/trl_fields.py classifies it (docs/trl-grpoconfig-fields.md):
honoured with TRL's meaning, accepted without effect (with a warning), or refused in one line. Attributes read back as TRL's do: `args.output_dir`, `args.learning_rate`, `args.max_completion_length`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from vlm_grpo.api.trl_fields import RULES, trl_defaults, trl_run_defaults, translate
from vlm_grpo.api.trl_translations import BATCH_FIELDS
from vlm_grpo.grpo.setting_fields import ArgumentTypeError
from vlm_grpo.grpo.settings.sources import canonical_key, load_config, merge_settings, read_yaml, to_yaml


# fields TRL 1.16's GRPOConfig no longer has, with what to write instead
REMOVED_IN_TRL = {
    "warmup_ratio": "give warmup_steps a float below 1, a share of the run's steps, as transformers reads it",
    "overwrite_output_dir": "a run into an output_dir that holds one moves the earlier run into a dated folder there",
}


class GRPOConfig:
    """The settings of a GRPO run (see the module docstring); `GRPOTrainer(args=...)` completes them with the
    model, the data and the rewards it is given."""

    stage = "grpo"
    default_output_dir = "runs/latest"
    _trl_defaults = True  # unset TRL fields take TRL's defaults (`of_settings()`: without them)

    @classmethod
    def of_settings(cls) -> "GRPOConfig":
        """The arguments of a trainer built from resolved settings (the CLI): no TRL default applies."""
        bare = type(cls.__name__, (cls,), {"_trl_defaults": False})
        return bare()

    def __init__(self, config: str | Path | None = None, **settings: Any):
        if config is not None and not isinstance(config, (str, os.PathLike)):
            raise ArgumentTypeError(f"{type(self).__name__} config: got {config!r:.80}; it takes a YAML "
                                    "settings file's path (settings themselves go as keywords)")
        for name, instead in REMOVED_IN_TRL.items():  # TRL 1.16's GRPOConfig has no such keyword: refused as it refuses
            if name in settings:
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument {name!r} "
                                f"(TRL 1.16 removed it; {instead})")
        object.__setattr__(self, "config_file", config)
        object.__setattr__(self, "given", dict(settings))  # the keywords as written (TRL's names included)
        if "audit_rewards" in settings:  # the reward audit before step 1 (off by default from Python, as in TRL)
            settings["guard.audit_at_start"] = bool(settings.pop("audit_rewards"))
        # A script's unset TRL fields take TRL's defaults (a settings file, or the CLI's trainer, keeps ours)
        base = trl_run_defaults() if config is None and self._trl_defaults else {}
        if any(k in settings for k in ("batch_size", "data.batch_size")):  # our prompt count replaces TRL's batch
            base = {k: v for k, v in base.items() if k not in BATCH_FIELDS}
        translated = translate({**base, **settings})  # TRL's fields with TRL's meaning (api/trl_fields.py)
        schedule = {k.removeprefix("trl."): translated.pop(k) for k in list(translated) if k.startswith("trl.")}
        data = merge_settings(read_yaml(config) if config else {}, translated)
        object.__setattr__(self, "settings", data)  # the mapping our parser reads (YAML underneath the keywords)
        object.__setattr__(self, "schedule", schedule)  # TRL's logging/evaluation moments, for the trainer
        object.__setattr__(self, "train_config", load_config(base=self._with_defaults(data)))

    def _with_defaults(self, data: dict[str, Any]) -> dict[str, Any]:
        logging = data.get("logging")
        if "output_dir" in data or "logging.output_dir" in data or (isinstance(logging, dict) and "output_dir" in logging):
            return data
        return merge_settings({"logging": {"output_dir": self.default_output_dir}}, data)

    def mapping(self) -> dict[str, Any]:
        """The settings as a YAML mapping, the stage's default output directory included."""
        return copy.deepcopy(self._with_defaults(self.settings))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        given = object.__getattribute__(self, "given")
        if name == "accelerator_config":  # transformers' object, as TRL's args hold it; no batches are dispatched
            from transformers.trainer_pt_utils import AcceleratorConfig

            value = given.get(name) or {}
            value = value if isinstance(value, dict) else vars(value)
            return AcceleratorConfig(**{"dispatch_batches": False, **value})
        if name in given and (name == "audit_rewards" or (name in RULES and RULES[name].to is not None)):
            return given[name]  # a TRL field whose value was translated: read back as written
        try:
            key, translation = canonical_key(name)
        except ValueError as err:
            defaults = trl_defaults()
            if name in RULES and name in defaults:  # a TRL field left at TRL's default (callbacks may read it)
                return given.get(name, defaults[name])
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}: {err}") from None
        section, _, field = key.rpartition(".")
        value = getattr(getattr(self.train_config, section) if section else self.train_config, field)
        if translation is not None:  # TRL's booleans (bf16, fp16): whether our value is the one they stand for
            return value == translation[True]
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        """`args.learning_rate = 1e-4` as in TRL: the setting is checked again with the others."""
        settings = {**self.given, name: value}
        type(self).__init__(self, self.config_file, **settings)

    def to_dict(self) -> dict[str, Any]:
        return self.train_config.to_dict()

    def to_yaml(self) -> str:
        return to_yaml(self.train_config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.given.items())})"


class SFTConfig(GRPOConfig):
    """The settings of a supervised warm-up (`SFTTrainer(args=...)`): the same settings, SFT's own under `sft`."""

    stage = "sft"
    default_output_dir = "runs/sft-latest"
    _trl_defaults = False  # TRL's SFTConfig defaults differ from its GRPOConfig's: this project's apply


__all__ = ["GRPOConfig", "SFTConfig"]
