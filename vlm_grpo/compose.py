"""`compose`: load a vision donor and a language donor, assemble the hybrid (the pairing family's file, found by
the vision donor's model type; shared pieces in adapters/assembly.py), save it.

The vision donors are the ones a hybrid family declares (`Composer.vision_donor_types`): a whole VLM, given as any
`--model` value and loaded by the one loader when its pairing asks for it (families/hybrid.py), or a vision-model
checkpoint (families/hybrid_llava.py); the language donor is a causal-LM checkpoint or a GGUF file (vlm_grpo/gguf.py: a .gguf file, a directory holding
one, or a bundled name such as `smollm2`), read as float weights. The output is an ordinary checkpoint
(`--model hybrid:DIR`).
"""

from __future__ import annotations

from pathlib import Path

from vlm_grpo.adapters.model_dirs import read_model_type
from vlm_grpo.adapters.model_spec import ModelSpec, parse_model_spec
from vlm_grpo.adapters.remote_code import check_remote_code
from vlm_grpo.adapters.registry import adapter_class, all_presets, composer_for
from vlm_grpo.gguf import find_gguf, gguf_model_type, load_gguf
from vlm_grpo.loader import load_model


def compose(vision_src: str, llm_src: str, out_dir: str, seed: int = 0, trust_remote_code: bool = False) -> Path:
    """Build the hybrid of `vision_src` + `llm_src` and save it (model, processor, tokenizer) in `out_dir`.

    The family that pairs with the vision donor's `model_type` is found through the registry (each hybrid family
    declares its vision donors); it checks the LM before anything large loads, then assembles. A donor that ships
    its own code is refused unless `trust_remote_code` (never a y/N prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vision_spec = parse_model_spec(vision_src)
    if vision_spec.kind == "checkpoint":
        check_remote_code(vision_spec.name, trust_remote_code, what="the vision donor")
    if find_gguf(llm_src) is None:
        check_remote_code(llm_src, trust_remote_code, what="the language donor")
    vision_type = _model_type(vision_spec)
    gguf = find_gguf(llm_src)  # an ambiguous LM source is named first, before the pairing is looked up
    composer = composer_for(vision_type)
    composer.check_lm_donor(vision_type, gguf_model_type(gguf) if gguf else read_model_type(llm_src))
    if gguf:
        lm, lm_tokenizer = load_gguf(gguf)
    else:
        lm = AutoModelForCausalLM.from_pretrained(llm_src, dtype="auto", trust_remote_code=trust_remote_code)
        lm_tokenizer = AutoTokenizer.from_pretrained(llm_src, trust_remote_code=trust_remote_code)
    def vision_donor():  # a whole VLM as the donor (the Qwen pairing), loaded only by a pairing that needs it
        return load_model(vision_src, seed=seed, dtype="auto", device="cpu", decide_cache=False,
                          trust_remote_code=trust_remote_code)

    result = composer.assemble_from(vision_spec.name, lm, lm_tokenizer, seed, vision_donor)
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
    cls = adapter_class(spec.name) if spec.kind == "tiny" else all_presets()[spec.name]
    return cls.model_class.config_class.model_type
