"""From defaults, a YAML file and `--key value` words to one checked TrainConfig.

Layers are merged first (defaults <- recipe and shipped-model defaults <- YAML <- command line) and the
dataclasses are built once from the result, so every value meets the same checks wherever it came from.
A key is `section.field` (`--loss.beta 0.04`) or a field name unique across sections (`--beta 0.04`);
dashes and underscores are the same. TRL's names are accepted where they mean the same (`TRL_NAMES`) and
refused with the reason where they do not (`NOT_THE_SAME`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from vlm_grpo.file_kinds import not_a_file
from vlm_grpo.grpo.settings.sections import SECTIONS, TrainConfig
from vlm_grpo.grpo.data.recipe_source import HUB_ID, build_options, resolve_recipe
from vlm_grpo.grpo.setting_fields import SettingError, coerce, help_of, inline_yaml
from vlm_grpo.grpo.yaml_text import YAMLProblem, load_yaml
from vlm_grpo.recipes import Recipe

ALIASES = {"model": "model.name"}  # `--model X` sets model.name
# `--reward X` (again and again) adds one entry to a list setting
APPENDS = {"reward": "data.rewards", "reward_model": "data.reward_models", "tool": "tools.tools"}
# TRL GRPOConfig names with the same meaning here: name -> (our key, value translation or None)
TRL_NAMES: dict[str, tuple[str, dict | None]] = {
    "max_completion_length": ("generation.max_new_tokens", None),
    "save_steps": ("logging.save_every", None),
    "save_total_limit": ("logging.keep_checkpoints", None),
    "lr_scheduler_type": ("optim.lr_scheduler", None),
    "hub_private_repo": ("logging.hub_private", None),
    "gradient_checkpointing": ("perf.gradient_checkpointing", None),
    "num_train_epochs": ("epochs", None),
    "data_seed": ("data.data_seed", None),
    "shuffle_dataset": ("data.shuffle", None),
    "optim": ("optim.optimizer", None),
    "adam_epsilon": ("optim.adam_eps", None),
    "bf16": ("mixed_precision", {True: "bf16", False: "no"}),
    "fp16": ("mixed_precision", {True: "fp16", False: "no"}),
    # TRL's script arguments (`trl grpo --dataset_name ...`)
    "dataset_name": ("data.dataset", None),
    "dataset_train_split": ("data.dataset_split", None),
    "dataset_test_split": ("eval.split", None),
    # vLLM rollouts (rollout section; its other vllm_* fields carry TRL's names)
    "use_vllm": ("rollout.engine", {True: "vllm", False: "transformers"}),
    "vllm_importance_sampling_cap": ("rollout.vllm_importance_sampling_clip_max", None),  # TRL's deprecated name
}
NOT_THE_SAME = {
    "per_device_train_batch_size": "TRL counts completions per device; here data.batch_size counts prompts per "
    "process and data.num_generations completions per prompt (TRL's value = batch_size x num_generations; the Python "
    "API's GRPOConfig converts it)",
    "logging_steps": "every step is logged to metrics.jsonl; logging.log_every N sends every Nth to the trackers "
    "(the Python API's GRPOConfig takes logging_steps with TRL's meaning)",
    "max_prompt_length": "prompts are never cut: an image's tokens must stay whole",
}
DERIVED = {"loss.max_completion_length": "it is generation.max_new_tokens (TRL: max_completion_length)"}
TRUST_FLAGS = {"trust_checkpoint": "--trust-checkpoint", "model.trust_remote_code": "--trust-remote-code",
               "model.allow_pickle_weights": "--allow-pickle-weights"}  # settings that let a file run code
HISTORY = "history"  # config.yaml's record of the run's resumes (resume_rules.py): read by people, not a setting


class RefusedName(SettingError):
    """A TRL name with no same-meaning setting here; all those given are refused in one message."""


def refused_together(errors: list[RefusedName]) -> SettingError:
    if len(errors) == 1:
        return errors[0]
    return SettingError(", ".join(e.name for e in errors), "TRL's names with no same-meaning setting here: "
                        + "; ".join(f"{e.name}: {NOT_THE_SAME[e.name]}" for e in errors))


def _fields(section: str | None) -> dict[str, dataclasses.Field]:
    cls = SECTIONS[section] if section else TrainConfig
    return {f.name: f for f in dataclasses.fields(cls) if not (section is None and f.name in SECTIONS)}


def canonical_key(key: str) -> tuple[str, dict | None]:
    """(`section.field` or a top-level `field`, value translation) for a key as a user writes it."""
    key = key.lstrip("-").replace("-", "_")
    if key in NOT_THE_SAME:
        raise RefusedName(key, f"TRL's {key} has no same-meaning setting here: {NOT_THE_SAME[key]}")
    if key in ALIASES:
        return ALIASES[key], None
    if key in TRL_NAMES:
        return TRL_NAMES[key]
    if "." in key:
        section, name = key.split(".", 1)
        if section not in SECTIONS or name not in _fields(section):
            raise SettingError(key, "unknown setting" + _suggestion(key))
        matches = [key]
    else:
        matches = [name for name in _fields(None) if name == key]
        matches += [f"{s}.{key}" for s in SECTIONS if key in _fields(s)]
    if not matches:
        raise SettingError(key, "unknown setting" + _suggestion(key))
    if len(matches) > 1:
        raise SettingError(key, f"ambiguous ({', '.join(matches)}); write it as section.field")
    if matches[0] in DERIVED:
        raise SettingError(key, f"cannot be set: {DERIVED[matches[0]]}")
    return matches[0], None


@functools.lru_cache(maxsize=256)  # TRL's callbacks probe the same unknown names on every step
def _suggestion(key: str) -> str:
    import difflib

    names = [f"{s}.{n}" for s in SECTIONS for n in _fields(s)] + list(_fields(None))
    close = difflib.get_close_matches(key, names + [n.split(".", 1)[-1] for n in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else " (see `vlm-grpo train --help`)"


def _hint(key: str):
    section, _, name = key.rpartition(".")
    cls = SECTIONS[section] if section else TrainConfig
    return typing.get_type_hints(cls)[name]


def _put(values: dict[str, Any], key: str, value: Any, refused: list[RefusedName] | None = None) -> None:
    """`key: value` into `values` as a canonical key and typed value; a refused TRL name goes to `refused`."""
    if refused is not None:
        try:
            return _put(values, key, value)
        except RefusedName as err:
            refused.append(err)
            return None
    short = key.lstrip("-").replace("-", "_")
    if short in APPENDS:  # each value is one whole entry: a spec is never split at commas
        name = APPENDS[short]
        entries = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, (bool, dict, list)) or v is None for v in entries):
            raise SettingError(short, f"{value!r} is not a {name.rpartition('.')[2]} entry (e.g. module:function)")
        values[name] = [*values.get(name, []), *map(str, entries)]
        return
    if short == "resume_from_checkpoint":  # TRL: true (the newest) or a checkpoint path
        value = inline_yaml(value, short) if isinstance(value, str) else value
        key, value = ("resume", value) if isinstance(value, bool) else ("resume_from", value)
    name, translation = canonical_key(key)
    if translation is not None:
        flag = coerce(value, bool, key)
        if not flag and values.get(name, _default(name)) != translation[True]:
            return None  # `fp16: false` rules fp16 out; it does not undo a `bf16: true` given before it
        value = translation[flag]
    values[name] = coerce(value, _hint(name), name)


def _default(key: str) -> Any:
    section, _, name = key.rpartition(".")
    field = _fields(section or None)[name]
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _meaning(key: str, value: Any) -> tuple[str, Any, Any] | None:
    """(canonical key, value as stored, the value it only rules out: TRL's `fp16: false` rules out "fp16", else None)
    of one `key: value` as a user writes it; None for a list entry (`--reward` adds, never replaces) or a key that is
    refused anyway (its own error names it)."""
    short = str(key).lstrip("-").replace("-", "_")
    if short in APPENDS:
        return None
    if short == "resume_from_checkpoint":
        short = "resume" if isinstance(value, bool) or str(value).lower() in ("true", "false") else "resume_from"
    try:
        name, translation = canonical_key(short)
        if translation is None:
            return name, coerce(value, _hint(name), name), None
        flag = coerce(value, bool, short)
        return name, translation[flag], None if flag else translation[True]
    except SettingError:
        return None


def _agree(a: tuple[str, Any, Any], b: tuple[str, Any, Any]) -> bool:
    """Two spellings of one setting that cannot disagree: the same value, or a TRL flag that only rules a value out
    beside one that sets another (`bf16: true` with `fp16: false`)."""
    if a[2] is not None or b[2] is not None:
        return (a[2] is None or b[1] != a[2]) and (b[2] is None or a[1] != b[2])
    return a[1] == b[1]


def _repeats(pairs: list[tuple[str, Any]]):
    """(canonical key, first spelling and value, later spelling and value) of each setting two pairs give unlike."""
    seen: dict[str, tuple[str, tuple[str, Any, Any]]] = {}
    for key, value in pairs:
        meaning = _meaning(key, value)
        if meaning is None:
            continue
        first = seen.get(meaning[0])
        if first is not None and not _agree(first[1], meaning):
            yield meaning[0], f"{first[0]}: {first[1][1]!r}", f"{key}: {meaning[1]!r}"
        seen[meaning[0]] = (str(key), meaning)


def refuse_repeated(pairs: list[tuple[str, Any]], source: str) -> None:
    """A setting written twice within one file (a TRL name and this project's, a dash and an underscore spelling)
    is refused naming both spellings: a file never keeps one of two values in silence."""
    for name, first, later in _repeats(pairs):
        raise SettingError(name, f"{source} sets it twice, as {first} and as {later}; keep one")


def note_repeated(pairs: list[tuple[str, Any]]) -> None:
    """On the command line a later flag replaces an earlier one (argparse's rule, which wrapper scripts that append
    their overrides rely on); each replacement is said on stderr, naming both."""
    import sys

    for name, first, later in _repeats(pairs):
        print(f"setting {name!r}: {later} replaces {first} given earlier on the command line", file=sys.stderr)


def mapping_pairs(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A settings mapping's `key: value` pairs, sections flattened (`optim: {lr: ..}` -> `optim.lr`)."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        if not prefix and key == HISTORY:
            continue
        if not prefix and key in SECTIONS and isinstance(value, dict):
            pairs += mapping_pairs(value, prefix=f"{key}.")
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs


def _word_pairs(words: list[str]) -> list[tuple[str, Any]]:
    """`--key value` words as pairs (a bare `--flag`: true)."""
    pairs, i = [], 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            pairs.append((words[i], words[i + 1]))
            i += 2
        else:
            pairs.append((words[i], True))
            i += 1
    return pairs


def _collect_mapping(values: dict[str, Any], data: dict[str, Any], refused=None) -> None:
    for key, value in mapping_pairs(data):
        _put(values, key, value, refused)


def _collect_words(values: dict[str, Any], words: list[str], refused=None) -> None:
    """`--key value` pairs (a bare `--flag` means true); the later of two values for one setting wins, said."""
    pairs = _word_pairs(words)
    note_repeated(pairs)
    for key, value in pairs:
        if not key.startswith("--"):
            raise SettingError(key, "expected --key value")
        _put(values, key, value, refused)


def _section(values: dict[str, Any], name: str):
    """One section's dataclass from the collected values (its own checks only)."""
    kwargs = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(f"{name}.")}
    try:
        return SECTIONS[name](**kwargs)
    except SettingError as err:
        raise err.within(name) from None


def build_config(values: dict[str, Any]) -> TrainConfig:
    sections = {name: _section(values, name) for name in SECTIONS}
    return TrainConfig(**sections, **{k: v for k, v in values.items() if "." not in k})


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    problem = not_a_file(path)  # a directory, FIFO or device is named as what it is (a FIFO would block a read)
    if problem:
        raise SettingError("config", problem)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
    except UnicodeDecodeError as err:
        raise SettingError("config", f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                           f"{err.start})") from None
    except YAMLProblem as err:
        raise SettingError("config", str(err)) from None
    if not isinstance(data, dict):
        raise SettingError("config", f"{path} must hold a mapping of settings")
    refuse_trust_keys(data, path)
    refuse_repeated(mapping_pairs(data), str(path))
    return data


def read_configs(paths: str | Path | list | tuple | None) -> tuple[dict[str, Any], str | None]:
    """(settings, where they came from) of one or more `--config` files. Several files are merged only when no
    setting is in two of them: which of two values a run takes is never decided by the order of the flags."""
    if not paths:
        return {}, None
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for path in paths:
        data = read_yaml(path)
        for key, value in mapping_pairs(data):
            meaning = _meaning(key, value)
            if meaning is None:
                continue
            if meaning[0] in owner and owner[meaning[0]] != str(path):
                raise SettingError(meaning[0], f"set in two --config files, {owner[meaning[0]]} and {path}; set it "
                                   "in one of them (or on the command line, which wins over every file)")
            owner[meaning[0]] = str(path)
        merged = merge_settings(merged, data)
    return merged, ", ".join(map(str, paths))


def refuse_trust_keys(data: dict[str, Any], source: str | Path) -> None:
    """A settings mapping read from a file may set no trust setting (a file may have been shipped by someone else)."""
    for key in _trust_keys(data):
        raise SettingError(key, f"{source} may not set it: trust is given per command ({TRUST_FLAGS[key]} on the "
                           "command line, or the Python API's argument), never by a file someone may have shipped")


def _trust_keys(data: dict[str, Any]) -> list[str]:
    """The trust settings a YAML mapping sets, however written (`model.trust_remote_code`, `trust-remote-code` ...)."""
    found = []
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if isinstance(value, dict) and name in SECTIONS:
            found += [k for k in _trust_keys({f"{name}.{k}": v for k, v in value.items()})]
            continue
        for canonical in TRUST_FLAGS:
            if name in (canonical, canonical.rpartition(".")[2]):
                found.append(canonical)
    return found


def without_trust(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as a file or a checkpoint keeps them: trust is never saved, so a resume must be given it again."""
    out = {k: v for k, v in settings.items() if k not in TRUST_FLAGS}
    if isinstance(out.get("model"), dict):
        out["model"] = {k: v for k, v in out["model"].items() if f"model.{k}" not in TRUST_FLAGS}
    return out


def _collect(file_data: dict[str, Any] | None, overrides: list[str] | None, base: dict | None = None) -> dict[str, Any]:
    """`base` mapping <- YAML mapping <- command-line words, as canonical keys and typed values. TRL names with no
    same-meaning setting are refused all at once, in one message."""
    values: dict[str, Any] = {}
    refused: list[RefusedName] = []
    if base:
        _collect_mapping(values, base, refused=refused)
    if file_data:
        _collect_mapping(values, file_data, refused=refused)
    if overrides:
        _collect_words(values, overrides, refused=refused)
    if refused:
        raise refused_together(refused)
    return values


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None) -> TrainConfig:
    """Defaults <- `base` mapping <- YAML file <- command-line words, checked once merged."""
    from_file, where = read_configs(path)
    cfg = build_config(_collect(from_file or None, overrides, base))
    warn_remote_vllm_server(cfg, where, from_file, overrides)
    return cfg


def warn_remote_vllm_server(cfg: TrainConfig, path: str | Path | None, from_file: dict[str, Any] | None,
                            overrides: list[str] | None) -> None:
    """A vLLM server address that a settings FILE gave and that is not this machine's loopback is named on stderr:
    the trainer sends that server its key and the policy's weights, and a file may have come from someone else. An
    address given on the command line is the user's own."""
    import sys
    from urllib.parse import urlsplit

    from vlm_grpo.grpo.rollout.vllm.access import settings_host_warning

    rollout = cfg.rollout
    if not path or not from_file or not (rollout.uses_vllm and rollout.vllm_mode == "server"):
        return
    name = "vllm_server_base_url" if rollout.vllm_server_base_url else "vllm_server_host"
    key = f"rollout.{name}"
    value = getattr(rollout, name)
    if _collect(from_file, None).get(key) != value or key in _collect(None, overrides):
        return  # the address in use is not the file's
    host = (urlsplit(value).hostname or value) if name == "vllm_server_base_url" else value
    warning = settings_host_warning(path, key, value, host)
    if warning:
        print(warning, file=sys.stderr)


def merge_settings(*layers: dict[str, Any]) -> dict[str, Any]:
    """Setting mappings merged section by section; a later layer wins."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def load_recipe_config(path: str | Path | None = None, overrides: list[str] | None = None,
                       settings: dict[str, Any] | None = None) -> tuple[TrainConfig, Recipe]:
    """(settings, recipe): `load_config` with defaults underneath the file and the command line: the chosen
    recipe's, then, when the policy is a checkpoint shipped in the package (`pretrained:NAME`, no `init_from`)
    and the recipe is the one it was trained for, the GRPO settings that go with it (vlm_grpo/pretrained).
    Data settings the recipe cannot use (a dataset for a generated task, a missing file) are refused here,
    before any model loads. `settings`: a mapping as the YAML file holds (the Python API's), above the file."""
    from vlm_grpo import pretrained

    from_file, where = read_configs(path)
    file_data = merge_settings(from_file, settings or {}) or None
    # Which recipe and model: from the user's values alone; the whole settings are checked only once the
    # defaults are underneath (a cross-setting check must see the batch size the defaults give).
    user = _collect(file_data, overrides)
    data, model = _section(user, "data"), _section(user, "model")
    recipe = resolve_recipe(data.recipe)
    layers = [recipe.defaults]
    if model.init_from is None:
        model_defaults = pretrained.run_defaults(model.name)
        if model_defaults.get("data", {}).get("recipe", data.recipe) == data.recipe:
            layers.append(model_defaults)
    base = merge_settings(*layers)
    cfg = build_config(_collect(file_data, overrides, base) if base else user)
    build_options(recipe, cfg.data)
    warn_remote_vllm_server(cfg, where, from_file, overrides)
    return cfg, recipe


def check_sources(cfg: TrainConfig) -> None:
    """Model sources that cannot work, refused before anything loads (one line naming the setting)."""
    from vlm_grpo.adapters.model_spec import parse_model_spec

    for key, spec in (("model.name", cfg.model.name), ("model.init_from", cfg.model.init_from)):
        if spec is None:
            continue
        try:
            parsed = parse_model_spec(spec)
        except ValueError as err:
            raise SettingError(key, str(err)) from None
        if parsed.kind == "checkpoint" and not os.path.exists(parsed.name) and _hub_id(parsed) is None:
            raise SettingError(key, f"no such directory or hub id: {parsed.name}")


def _hub_id(parsed) -> str | None:
    name = parsed.name
    return name if parsed.kind == "checkpoint" and not os.path.exists(name) and HUB_ID.fullmatch(name) else None


def hub_id_of(spec: str) -> str | None:
    """The hub repo id a model spec names (`org/name`, `FAMILY:org/name`); None for a local path, a tiny twin, a
    preset or a shipped checkpoint."""
    from vlm_grpo.adapters.model_spec import parse_model_spec

    return _hub_id(parse_model_spec(spec))


def to_yaml(cfg: TrainConfig, history: list[dict[str, Any]] | None = None) -> str:
    """The resolved settings as a YAML file `--config` reads back (derived values left out, and trust in a
    checkpoint, which is given per command and never inherited from a file), and, for a resumed run, its `history`:
    each resume's step and the settings that changed there (ignored when read back)."""
    data = without_trust(_plain(cfg.to_dict()))
    data["loss"].pop("max_completion_length", None)
    if history:
        data[HISTORY] = _plain(history)
    return yaml.safe_dump(data, sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@functools.cache
def settings_help() -> str:
    """Every setting with its type, default and help, by section (for `--help`)."""
    lines = ["settings (--section.field VALUE, or --field VALUE when the name is unique; YAML keys alike):"]
    defaults = TrainConfig()
    for section in [None, *SECTIONS]:
        obj = getattr(defaults, section) if section else defaults
        lines.append(f"\n  {section or 'run'}:")
        for name, f in _fields(section).items():
            key = f"{section}.{name}" if section else name
            if key in DERIVED:
                continue
            hint = _hint(key)
            kind = getattr(hint, "__name__", str(hint)).replace("typing.", "")
            lines.append(f"    --{key} ({kind}, default {getattr(obj, name)!r})  {help_of(f)}")
    lines.append("\n  --reward SPEC adds one entry to data.rewards each time it is given, --reward-model MODEL one to "
                 "data.reward_models")
    lines.append("  --tool SPEC adds one entry to tools.tools each time it is given")
    lines.append("\n  TRL names accepted: " + ", ".join(f"{k} -> {v[0]}" for k, v in TRL_NAMES.items())
                 + ", resume_from_checkpoint -> resume (true) or resume_from (a path)")
    return "\n".join(lines)
