"""The generic adapter: any image-text-to-text model type that no family file claims.

Model and processor come through the type's own transformers classes (`AutoModelForImageTextToText`'s mapping,
`AutoProcessor`); the module groups from the model's structure (groups.py); the image token from the config or
the processor; how many image features each sample's images give from the model's own `get_image_features`,
run once per distinct image-tensor shape; which rows of each processor tensor belong to which sample from the
processor run on each sample alone. Which generation and scoring paths are safe is not assumed: `calibrate.py`
measures them on the loaded model (placeholder, positions, shared features, shared prompt prefix), and what it
cannot prove is not used.
"""

from __future__ import annotations

import hashlib
import inspect
from functools import lru_cache
from typing import Any, ClassVar

import torch

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.features import hf_core, with_mask_positions
from vlm_grpo.adapters.generic import support
from vlm_grpo.adapters.generic.groups import check_layout, discover_layout
from vlm_grpo.adapters.generic.layout import GenericLayout
from vlm_grpo.adapters.generic.rows import alone_rows, localize_indices, rebase_indices, sample_rows, tensor_rows
from vlm_grpo.adapters.generic.support import GenericUnsupported

TEXT_KEYS = ("input_ids", "attention_mask", "labels")  # labels: a training target some processors add, never an input


class GenericAdapter(GenericLayout, VLMAdapter):
    """One subclass per model type (`generic_adapter_class`); instances calibrate themselves on construction."""

    tiny_architecture: ClassVar[Architecture] = Architecture(vision={}, text={}, note="the type's default config, shrunk")
    # decided by calibration (calibrate.py), per loaded model
    nested_images: bool = False
    mask_positions: bool = False
    completion_token_type: int = 0  # the value token-shaped inputs take over a completion
    # not calibrated: an unknown model's forward may rebuild its own mask from token types or images
    packs_completions: ClassVar[bool] = False

    def __init__(self, model, processor, source: str = "", use_cache: bool | None = None, calibrate: bool = True):
        super().__init__(model, processor, source=source, use_cache=use_cache)
        support.check_generation(self.family, model)
        # found from the structure; checked by `check_module_groups` once any `model.module_groups` override is in
        self.module_layout = discover_layout(model)
        self._features_per_shape: dict[tuple, list[int]] = {}
        self.packed_keys: set[str] = set()  # tensors kept last-dimension-first, one row per column (rows.py)
        self.index_keys: dict[str, tuple[str, int]] = {}  # index tensors held per sample (rows.localize_indices)
        self.calibration = None
        if calibrate:
            from vlm_grpo.adapters.generic.calibrate import calibrate as run

            self.calibration = run(self)

    def check_module_groups(self) -> None:
        check_layout(self.module_layout, self.model, self.family)

    # ---------------------------------------------------------------- construction
    @classmethod
    def build(cls, arch=None, seed: int = 0, dtype: torch.dtype = torch.float32) -> "GenericAdapter":
        from vlm_grpo.adapters.generic.twin import TwinError
        from vlm_grpo.adapters.generic.twin_model import build_twin

        try:
            model, processor = build_twin(cls.family, cls.model_class, seed=seed, dtype=dtype)
        except (TwinError, GenericUnsupported):
            raise
        except Exception as err:  # anything else the type's classes raise: named, in one line
            raise TwinError(f"{cls.family}: its tiny twin cannot be built ({type(err).__name__}: "
                            f"{(str(err).splitlines() or [''])[0][:160]})") from err
        return cls(model, processor, source=f"tiny:{cls.family}")

    # ---------------------------------------------------------------- tokens
    @property
    def image_token_id(self) -> int:
        return support.image_token_id(self.model.config, self.processor, self.family)

    def _extra_suppressed_ids(self) -> list[int]:
        return support.layout_token_ids(self.model.config, self.processor, keep=set(self.eos_token_ids))

    # ---------------------------------------------------------------- encoding
    def _process(self, texts, images):
        kwargs: dict[str, Any] = {"padding": True, "return_tensors": "pt"}
        if "mm_token_type_ids" in getattr(self.processor, "model_input_names", ()) and self._forward_takes(
                "mm_token_type_ids"):
            kwargs["return_mm_token_type_ids"] = True  # rotary index and token types are built from them
        if not any(images):
            return self.processor(text=texts, **kwargs)
        pictures = [list(s) for s in images] if self.nested_images else [img for s in images for img in s]
        return self.processor(text=texts, images=pictures, **kwargs)

    def _forward_takes(self, name: str) -> bool:
        return name in inspect.signature(type(hf_core(self.model)).forward).parameters

    def _run_processor(self, texts, images):
        features = self._process(texts, images)
        shape = tuple(features["input_ids"].shape)
        keys = [k for k, v in features.items() if isinstance(v, torch.Tensor) and k not in TEXT_KEYS
                and tuple(v.shape) != shape]
        # the rows each sample owns, from the processor run on each sample alone (read by _to_batch)
        self._alone = alone_rows(self, texts, images, keys) if keys and len(texts) > 1 else [
            tensor_rows(features, keys)]
        return features

    def _to_batch(self, features, images) -> PromptBatch:
        shape = tuple(features["input_ids"].shape)
        dtype = next(self.model.parameters()).dtype  # some image processors hand out bfloat16 pixels
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in features.items()
                   if isinstance(v, torch.Tensor) and k not in TEXT_KEYS}
        token_keys = tuple(k for k, v in tensors.items() if tuple(v.shape) == shape)
        mm_rows = {k: [1] * shape[0] for k in token_keys}
        image_side, image_rows = sample_rows(self.family, {k: v for k, v in tensors.items() if k not in token_keys},
                                             self._alone, self.packed_keys)
        if len(images) > 1:
            image_side = localize_indices(image_side, image_rows, self._alone, self.index_keys)
        tensors = {**{k: tensors[k] for k in token_keys}, **image_side}
        mm_rows.update(image_rows)
        batch = PromptBatch(input_ids=features["input_ids"], attention_mask=features["attention_mask"], mm=tensors,
                            mm_rows=mm_rows, image_spans=[[(0, 0)] * len(s) for s in images], token_keys=token_keys)
        return self.with_image_spans(batch)

    def model_inputs(self, batch: PromptBatch) -> dict[str, torch.Tensor]:
        return rebase_indices(self._unpacked(batch.model_inputs()), batch.mm_rows, self.index_keys)

    def _unpacked(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Packed tensors (kept one row per column) with their last dimension moved back where the model wants it."""
        return {k: v.movedim(0, -1) if k in self.packed_keys else v for k, v in tensors.items()}

    def vision_keys(self) -> tuple[str, ...]:
        """The processor tensors the model's image-feature function takes (named in its signature)."""
        return _named_parameters(type(_feature_owner(self.model)).get_image_features)

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        keys = [k for k in self.vision_keys() if k in batch.mm]
        if not keys:
            return [0] * len(batch)
        counts = []
        for i in range(len(batch)):
            one = batch.select([i])
            vision = self._unpacked({k: one.mm[k] for k in keys if k in one.mm})
            counts.append(sum(self.image_feature_counts(vision)) if vision and batch.images_per_sample[i] else 0)
        return counts

    def image_feature_counts(self, vision: dict[str, torch.Tensor]) -> list[int]:
        """Features per image of one sample's vision tensors, from the model's own image-feature function (run once
        per distinct shape; integer tensors such as grids and masks are part of the shape)."""
        signature = tuple((k, tuple(v.shape), _content(v)) for k, v in sorted(vision.items()))
        if signature not in self._features_per_shape:
            owner = _feature_owner(self.model)
            param = next(self.model.parameters())
            inputs = {k: (v.to(param.device, param.dtype) if v.is_floating_point() else v.to(param.device))
                      for k, v in vision.items()}
            with torch.no_grad():
                out = owner.get_image_features(**inputs, return_dict=True)
            per_image = support.features_per_image(out, self.family)
            self._features_per_shape[signature] = per_image
        return self._features_per_shape[signature]

    # ---------------------------------------------------------------- forward
    def completion_inputs(self, batch, completion_ids, completion_mask, completion_types=None):
        inputs = super().completion_inputs(batch, completion_ids, completion_mask, completion_types)
        for key in set(batch.token_keys) - set(completion_types or {}):  # completion text: the value calibration found
            inputs[key][:, batch.input_ids.shape[1]:] = self.completion_token_type
        # generate() counts positions from the attention mask; where the model's own forward counts pads instead,
        # calibration found it and the teacher-forced forward gets generate()'s positions
        return with_mask_positions(inputs) if self.mask_positions else inputs

    # ---------------------------------------------------------------- sharing hooks (a model's own rotary index)
    def _rope_index(self, inputs: dict, core):
        """(positions, per-row deltas) from the model's own `get_rope_index` when it has one and images are in."""
        owner = getattr(core, "model", core)
        index = getattr(owner, "get_rope_index", None)
        if index is None or not any(k in inputs for k in self.vision_keys() if k != "pixel_values"):
            return None
        names = _named_parameters(index)
        return index(**{k: inputs[k] for k in names if k in inputs})

    def shared_position_ids(self, full_inputs, core):
        # an inputs_embeds forward cannot rebuild multimodal rotary positions: hand it the model's own
        index = self._rope_index(full_inputs, core)
        return full_inputs.get("position_ids") if index is None else index[0]

    def expand_generation_state(self, prefix, repeats, core):
        owner = getattr(core, "model", core)
        if not hasattr(owner, "rope_deltas"):
            return
        index = self._rope_index(self.model_inputs(prefix), core)
        deltas = torch.zeros(len(prefix), 1, dtype=torch.long, device=prefix.input_ids.device) if index is None \
            else index[1]
        owner.rope_deltas = deltas.repeat_interleave(repeats, dim=0)

    def vision_call_images(self, args, kwargs):
        for key in ("grid_thw", "image_grid_thw"):
            grid = kwargs.get(key)
            if isinstance(grid, torch.Tensor):
                return int(grid.shape[0])
        return super().vision_call_images(args, kwargs)


def _feature_owner(model: torch.nn.Module) -> torch.nn.Module:
    core = hf_core(model)
    inner = getattr(core, "model", None)
    return inner if hasattr(inner, "get_image_features") else core


def _named_parameters(fn) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def _content(t: torch.Tensor) -> str:
    """What of a tensor's content can change the feature count: every value of an integer or boolean tensor (grids,
    masks), and which images or patches of a float tensor are all zero (padding that models drop)."""
    if t.is_floating_point():
        t = (t.flatten(start_dim=min(2, t.dim() - 1)) == 0).all(dim=-1) if t.dim() else t
    return hashlib.sha1(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


@lru_cache(maxsize=None)
def generic_adapter_class(model_type: str) -> type[GenericAdapter]:
    """The generic adapter of `model_type` (a class per type: `family`, `model_types`, `model_class` are its own)."""
    model_class = support.model_class_of(model_type)
    name = "Generic_" + "".join(p.capitalize() for p in model_type.replace("-", "_").replace(".", "_").split("_"))
    return type(name, (GenericAdapter,), {"family": model_type, "model_types": (model_type,), "model_class": model_class,
                                          "module_layout": None, "presets": {}, "__module__": __name__})
