"""`compose`: load a vision donor and a language donor, assemble the hybrid (adapters/assembly.py), save it.

The vision donor is any `--model` value of a Qwen2.5-VL-classes family (a checkpoint directory or hub id,
`FAMILY:PATH`, `tiny:...`, `preset:...`, loaded by the one loader) or a SigLIP/CLIP checkpoint; the
language donor is a causal-LM checkpoint or a GGUF file (vlm_grpo/gguf.py: a .gguf file, a directory holding
one, or a bundled name such as `smollm2`), read as float weights. The output is an ordinary checkpoint
(`--model hybrid:DIR`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlm_grpo.adapters.assembly import (
    QWEN_VISION_TYPES,
    assemble_llava,
    assemble_qwen,
    check_pairing,
    vision_part,
)
from vlm_grpo.adapters.model_spec import ModelSpec, parse_model_spec
from vlm_grpo.adapters.model_dirs import read_model_type
from vlm_grpo.adapters.registry import all_presets, family_class
from vlm_grpo.gguf import find_gguf, gguf_model_type, load_gguf
from vlm_grpo.loader import load_model


def compose(vision_src: str, llm_src: str, out_dir: str, seed: int = 0) -> Path:
    """Build the hybrid of `vision_src` + `llm_src` and save it (model, processor, tokenizer) in `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vision_spec = parse_model_spec(vision_src)
    vision_type = _model_type(vision_spec)
    gguf = find_gguf(llm_src)
    check_pairing(vision_type, gguf_model_type(gguf) if gguf else read_model_type(llm_src))  # before loading anything large
    if gguf:
        lm, lm_tokenizer = load_gguf(gguf)
    else:
        lm = AutoModelForCausalLM.from_pretrained(llm_src, dtype="auto")
        lm_tokenizer = AutoTokenizer.from_pretrained(llm_src)
    if vision_type in QWEN_VISION_TYPES:
        donor = load_model(vision_src, seed=seed, dtype="auto", device="cpu", decide_cache=False)
        result = assemble_qwen(donor.model, donor.processor, lm, lm_tokenizer, seed)
    else:
        from transformers import AutoModel

        vision = vision_part(AutoModel.from_pretrained(vision_spec.name, dtype="auto"))
        result = assemble_llava(vision, image_processor(vision_spec.name, vision.config), lm, lm_tokenizer, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.model.save_pretrained(out)
    result.processor.save_pretrained(out)
    for note in result.notes:
        print(f"compose: {note}")
    return out


def _model_type(spec: ModelSpec) -> str:
    if spec.kind == "checkpoint":
        return read_model_type(spec.name)
    cls = family_class(spec.name) if spec.kind == "tiny" else all_presets()[spec.name]
    return cls.model_class.config_class.model_type


def image_processor(vision_src: str, vision_config) -> Any:
    """The vision checkpoint's own image processor, or the family's default at its size when it has none."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(vision_src)
    except (OSError, ValueError):
        return default_image_processor(vision_config)


def default_image_processor(vision_config) -> Any:
    size = {"height": vision_config.image_size, "width": vision_config.image_size}
    if vision_config.model_type.startswith("siglip"):
        from transformers import SiglipImageProcessor

        return SiglipImageProcessor(size=size)
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": vision_config.image_size}, crop_size=size)
