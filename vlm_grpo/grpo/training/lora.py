"""LoRA and QLoRA on any adapter, with the reference policy for free.

- Default targets are the attention and MLP projections (q/k/v/o/gate/up/down) of the **language**
  group only. Vision towers use the same names (many ViTs call their projections so), so the target
  list is built as exact module names from `adapter.module_group_of`, never as bare suffixes.
- A mixture-of-experts model keeps its experts as 3-D tensors, not Linear modules: those of the `experts`
  sub-group get LoRA through peft's `target_parameters` (one low-rank pair per tensor, per expert), by default
  beside the language projections; a `target_modules` entry may name them too (e.g. `experts.down_proj`).
- `apply_lora` wraps `adapter.model` in place with peft; `adapter.generate` and the teacher-forced
  log-prob forward keep working, and `module_group_of` maps each LoRA matrix to its layer's group.
- `reference_disabled(adapter)`: GRPO's KL reference is the base model, which under LoRA is the same
  network with the adapter switched off: no second copy of the weights in memory.
- Modules named by `trainable_patterns` train whole beside the LoRA matrices as peft's `modules_to_save`
  copies, so the reference keeps the originals and the adapter checkpoint carries them.
- `merged_copy(adapter)`: a plain transformers model with the LoRA deltas folded in, for saving.
- QLoRA (`load_in_4bit=True`) needs bitsandbytes (CUDA or CPU) and a base loaded in 4 bit (`--load-in-4bit`;
  `VLMAdapter.load(..., load_in_4bit=True)`); it is prepared with peft's `prepare_model_for_kbit_training`, without
  the gradient checkpointing that function would switch on (`perf.gradient_checkpointing` decides that, so the
  shared-prompt forwards know). The merged copy of a 4-bit run folds the deltas into a full-precision base.
"""

from __future__ import annotations

import copy
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import torch

from vlm_grpo.adapters.quantization import four_bit_config, is_loaded_in_4bit
from vlm_grpo.grpo.settings.sections import LoraSettings
from vlm_grpo.adapters.freeze import wraps_lora

# The language model's attention and MLP projections, by role, under the names the supported LMs give them
# (`gate_up_proj`: a fused gate and up projection; `out_proj` and `w1`/`w3`/`w2`: other LMs' output and gate/up/down).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "w1", "w3", "w2")
DEFAULT_TARGETS = ATTENTION_PROJECTIONS + MLP_PROJECTIONS


def is_lora_wrapped(adapter) -> bool:
    return wraps_lora(adapter.model)


def lora_targets(adapter, settings: LoraSettings) -> list[str]:
    """Exact module names (as the unwrapped model names them) that receive LoRA matrices."""
    linears = [n for n, m in adapter.model.named_modules() if isinstance(m, torch.nn.Linear) and n]
    if settings.target_modules is None:
        targets = [
            n for n in linears
            if n.rsplit(".", 1)[-1] in DEFAULT_TARGETS and adapter.module_group_of(n + ".weight") == "language"
        ]
        if not targets:
            raise ValueError(f"no q/k/v/o/gate/up/down projection found in the language model of {adapter.family}")
        return targets
    targets, unmatched = [], []
    experts = expert_tensors(adapter)
    for entry in settings.target_modules:
        hits = [n for n in linears if n == entry or n.endswith("." + entry)]
        if not hits and not any(n == entry or n.endswith("." + entry) for n in experts):
            unmatched.append(entry)
        targets.extend(h for h in hits if h not in targets)
    if unmatched:
        raise ValueError(f"LoRA target_modules {unmatched} match no Linear module or expert tensor of {adapter.family}")
    return targets


def expert_tensors(adapter) -> list[str]:
    """Parameters of the `experts` sub-group that are not a Linear module's weight or bias (the 3-D tensors experts
    are stored in), as the unwrapped model names them."""
    linear = {n for n, m in adapter.model.named_modules() if isinstance(m, torch.nn.Linear)}
    return [n for n, p in adapter.model.named_parameters()
            if p.dim() >= 3 and n.rsplit(".", 1)[0] not in linear and adapter.training_group_of(n) == "experts"]


def lora_target_parameters(adapter, settings: LoraSettings) -> list[str]:
    """Expert tensors (full parameter names) that receive LoRA through peft's `target_parameters`."""
    experts = expert_tensors(adapter)
    if settings.target_modules is None:
        return experts
    return [n for n in experts if any(n == e or n.endswith("." + e) for e in settings.target_modules)]


def fully_trained_modules(adapter, patterns: Sequence[str]) -> list[str]:
    """The modules holding parameters that `patterns` (optim.trainable_patterns) name, in model order."""
    regexes = [re.compile(p) for p in patterns]
    modules: list[str] = []
    for name, _ in adapter.model.named_parameters():
        module = name.rsplit(".", 1)[0] if "." in name else ""
        if any(r.search(name) for r in regexes) and module not in modules:
            modules.append(module)
    return modules


def apply_lora(adapter, settings: LoraSettings, train_fully: Sequence[str] = ()):
    """Wrap `adapter.model` with LoRA (in place; returns `adapter`). r == 0 leaves it untouched.

    `train_fully`: trainable_patterns; the modules they name train whole beside the LoRA matrices, as
    trainable copies (peft's modules_to_save): the reference (adapter switched off) keeps the originals and
    the adapter checkpoint holds the copies."""
    if not settings.enabled:
        return adapter
    if is_lora_wrapped(adapter):
        raise ValueError(f"{adapter.family}: the model already carries LoRA matrices")
    from peft import LoraConfig, get_peft_model

    model = adapter.model
    targets = lora_targets(adapter, settings)
    tensors = lora_target_parameters(adapter, settings)
    full = fully_trained_modules(adapter, train_fully)
    if "" in full:
        raise ValueError("trainable_patterns name a parameter of the model's root module; under LoRA only whole "
                         "submodules can train beside the adapter")
    both = sorted(set(targets) & set(full))
    if both:
        raise ValueError(f"{both} get LoRA matrices and are trained whole by trainable_patterns: choose one "
                         "(lora.target_modules or optim.trainable_patterns)")
    if settings.load_in_4bit:
        four_bit_config()  # raises, saying so, without bitsandbytes
        if not is_loaded_in_4bit(model):
            raise ValueError(
                "load_in_4bit=True: the base model must already be loaded in 4 bit "
                "(VLMAdapter.load(path, load_in_4bit=True) or `--load-in-4bit`)"
            )
        from peft import prepare_model_for_kbit_training

        # casts the layers left in half precision (norms, embeddings) to fp32 and freezes the base
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        target_parameters=tensors or None,
        modules_to_save=full or None,
        bias="none",
    )
    with warnings.catch_warnings():
        # peft asks transformers a deprecated question while wrapping; not ours to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        adapter.model = get_peft_model(model, config)
    return adapter


@contextmanager
def reference_disabled(adapter) -> Iterator:
    """The reference policy: the same network with its LoRA adapter switched off (peft's
    `disable_adapter()`), i.e. exactly the frozen base model, without a second copy in memory.

        with torch.no_grad(), reference_disabled(adapter):
            ref_logprobs = completion_logprobs(adapter, batch, completion_ids, mask)

    Yields the adapter itself; LoRA is active again when the block exits (also on error).
    A model without LoRA has no such reference: keep a frozen copy instead.
    """
    if not is_lora_wrapped(adapter):
        raise ValueError(
            f"{adapter.family}: reference_disabled needs a LoRA-wrapped model (apply_lora with r > 0); "
            "without LoRA the reference policy must be a separate frozen copy"
        )
    with adapter.model.disable_adapter():
        yield adapter


def merged_copy(adapter) -> torch.nn.Module:
    """A plain transformers model with the LoRA deltas merged in (the adapter's own model is untouched).
    On a 4-bit base the merge re-quantizes and is lossy: the trainer merges into a full-precision reload instead."""
    model = copy.deepcopy(adapter.model)
    if not wraps_lora(model):
        return model
    return model.merge_and_unload()


def save_merged(adapter, out_dir: str | Path) -> None:
    """Save the merged model and the processor: a checkpoint `VLMAdapter.load` reads back."""
    merged_copy(adapter).save_pretrained(out_dir)
    adapter.processor.save_pretrained(out_dir)
