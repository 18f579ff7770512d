"""The generic adapter: any image-text-to-text model type without a family file.

The contract suite (test_contract.py) runs on every type recorded as passing; here: the cache probe on each of them,
two GRPO steps on a fixed subset (every type and recipe: test_generic_matrix.py, `-m generic_matrix`), loading a
saved twin by path and by `TYPE:PATH`, the `families --all` table, and the one-line refusals before any training.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import tiny_adapter
from vlm_grpo.adapters.generic.adapter import GenericAdapter, generic_adapter_class
from vlm_grpo.adapters.generic.status import GENERIC, generic_types, recorded, recorded_mapping
from vlm_grpo.adapters.generic.support import GenericUnsupported, image_text_types, needed_extra
from vlm_grpo.adapters.registry import MODEL_TYPES, is_generic_type
from vlm_grpo.cli import main
from vlm_grpo.compat.cache_probe import probe_cache
from vlm_grpo.loader import load_model

SERVED = [t for t in generic_types() if is_generic_type(t)]  # recorded as passing, no family file since
# two GRPO steps in the default run: M-RoPE with grids (qwen2_vl), any-resolution tiles with a learned newline
# (llava_next), per-sample padded tiles (idefics2), and image-size tensors with row breaks (lighton_ocr)
TRAINED = [t for t in ("qwen2_vl", "llava_next", "idefics2", "lighton_ocr") if t in SERVED]
FAST = ["--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2", "--data.train-size", "2",
        "--logging.progress", "false", "--data.recipe_options", "{image_size: 56}"]


def test_at_least_50_model_types_pass_and_every_other_has_a_reason():
    """Over the measured transformers' types (a newer one's new types are untested, listed apart)."""
    version, records = recorded()
    types = recorded_mapping()
    passing = [t for t in types if t in MODEL_TYPES or (t in records and records[t].status == GENERIC)]
    assert len(passing) >= 50, f"{len(passing)} model types pass: {passing}"
    for t in types:
        if t not in passing:
            assert t in records and records[t].reason, f"{t}: no recorded reason (re-run vlm-grpo families --measure)"


def test_families_all_lists_every_type(capsys):
    assert main(["families", "--all"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| model type")
            and not line.startswith("| ---")]
    assert sorted(r.split(" | ")[0][2:] for r in rows) == sorted(recorded_mapping())
    untested = [line[2:].split(" (")[0] for line in out.splitlines() if line.startswith("- ")]
    assert untested == sorted(set(image_text_types()) - set(recorded_mapping()))


@pytest.mark.parametrize("model_type", SERVED)
def test_cache_probe_on_every_generic_type(model_type):
    adapter = tiny_adapter(model_type)
    assert isinstance(adapter, GenericAdapter) and adapter.family == model_type
    report = probe_cache(adapter, steps=3)
    assert not report.blind, report.table()
    assert report.path_ok(report.cache_ok), report.table()
    assert recorded()[1][model_type].cache == ("cache" if report.cache_ok else "no cache")


@pytest.mark.parametrize("model_type", TRAINED)
def test_two_grpo_steps(model_type, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", f"tiny:{model_type}", "--recipe", "shapes", "--max-steps", "2",
                 "--output-dir", str(out), *FAST]) == 0
    assert (out / "final" / "config.json").is_file()


def test_calibrated_paths_match_the_record():
    """What calibration measures on a fresh twin is what the table says (shared features / prefix)."""
    for model_type in TRAINED:
        adapter = tiny_adapter(model_type)
        record = recorded()[1][model_type]
        assert (adapter.shares_features, adapter.shares_prefix) == (record.shares_features, record.shares_prefix)


@pytest.fixture(scope="module")
def saved_twin(tmp_path_factory):
    """A saved tiny twin of a type with no family file (Idefics2)."""
    path = tmp_path_factory.mktemp("idefics2-twin")
    generic_adapter_class("idefics2").tiny(seed=1).save(path)
    return path


@pytest.mark.parametrize("spec", ["{path}", "idefics2:{path}"])
def test_saved_twin_loads_and_trains(saved_twin, spec, tmp_path):
    model = spec.format(path=saved_twin)
    adapter = load_model(model, device="cpu", dtype=torch.float32)
    assert isinstance(adapter, GenericAdapter) and adapter.family == "idefics2"
    assert adapter.calibration.placeholder is None  # a checkpoint keeps its own chat template
    out = tmp_path / "run"
    assert main(["train", "--model", model, "--recipe", "shapes", "--max-steps", "2", "--output-dir", str(out),
                 *FAST]) == 0
    assert (out / "final" / "config.json").is_file()


# ---------------------------------------------------------------------------- refusals, one line, before training
def _refused(capsys, tmp_path, *args: str) -> str:
    out = tmp_path / "run"
    # exit 1: the run failed before training (2 is kept for settings refused before anything ran)
    assert main(["train", *args, "--max-steps", "2", "--output-dir", str(out), *FAST]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]  # beside progress bars of loading
    assert len(errors) == 1 and "Traceback" not in err, err
    assert not (out / "metrics.jsonl").exists()  # nothing trained
    return errors[0]


JANUS_GROUPS = {  # Janus also generates images: its generation side placed by hand
    "vision": ["model\\.vision_model\\.", "model\\.vqmodel\\."],
    "projector": ["model\\.aligner\\.", "model\\.generation_aligner\\."],
    "language": ["model\\.language_model\\.", "model\\.generation_embeddings\\."],
    "head": ["lm_head\\.", "model\\.generation_head\\."],
}


def test_ungroupable_modules_are_named_and_groups_can_be_given(capsys, tmp_path):
    err = _refused(capsys, tmp_path, "--model", "tiny:janus")
    assert "janus: parameters outside the module groups" in err and "generation_aligner" in err
    assert "model.module_groups" in err
    adapter = load_model("tiny:janus", device="cpu", decide_cache=False, module_groups=JANUS_GROUPS)
    groups = adapter.module_groups()
    assert all(groups[g] for g in JANUS_GROUPS)
    assert any(n.startswith("model.generation_head.") for n in groups["head"])


def test_image_token_count_disagreeing_with_the_features_is_named(capsys, tmp_path):
    adapter = generic_adapter_class("idefics2").tiny(seed=1)
    adapter.processor.image_seq_len += 3  # the processor now writes 3 placeholders too many per image
    adapter.save(tmp_path / "bad")
    err = _refused(capsys, tmp_path, "--model", str(tmp_path / "bad"))
    assert "idefics2: the processor's image tokens do not match the model's image features" in err


@pytest.mark.parametrize("model_type, missing", [
    ("pi0", "has no generation"),
    ("t5gemma2", "encoder-decoder"),
])
def test_types_the_loop_cannot_drive_are_refused(capsys, tmp_path, model_type, missing):
    err = _refused(capsys, tmp_path, "--model", f"tiny:{model_type}")
    assert err.startswith(f"vlm-grpo train: error: {model_type}: ") and missing in err


def test_the_encoder_decoder_refusal_rests_on_what_generate_returns(monkeypatch):
    """Florence-2's twin (docs/encoder-decoder.md): generate() hands back the decoder's tokens (start + completion),
    not the prompt followed by the completion, so the loop's completion slice is empty; a decoder forward over start
    + completion reproduces generate's log-probs, which is what support would build on."""
    from vlm_grpo.adapters.generic import support, twin_model
    from vlm_grpo.compat.cache_probe import probe_images

    monkeypatch.setattr(twin_model, "check_generation", lambda *args: None)
    model, processor = twin_model.build_twin("florence2", support.model_class_of("florence2"))
    processor.tokenizer.bos_token = processor.tokenizer.pad_token  # the twin's tokenizer has no BOS of its own
    inputs = processor(text=["What is in the image?"], images=[probe_images()[0]], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        forced = model(**inputs, decoder_input_ids=out.sequences[:, :-1]).logits
    assert out.sequences.shape[1] == 5 < inputs["input_ids"].shape[1]  # start + 4, no prompt in front
    assert out.sequences[:, inputs["input_ids"].shape[1]:].numel() == 0
    generated = torch.stack(out.logits, dim=1).log_softmax(-1)
    assert (forced.log_softmax(-1) - generated).abs().max().item() < 1e-5


def test_a_family_file_claims_its_types():
    for model_type, cls in MODEL_TYPES.items():
        assert not is_generic_type(model_type) and not issubclass(cls, GenericAdapter)
    with pytest.raises(GenericUnsupported, match="not an image-text-to-text model type"):
        generic_adapter_class("bert")


@pytest.mark.parametrize("message, extra", [
    ("TimmWrapperModel requires the timm library but it was not found in your environment.", "timm"),
    ("No module named 'scipy'", "scipy"),
])
def test_a_missing_optional_package_names_its_extra(message, extra):
    assert needed_extra(message) == f"needs {extra}: pip install 'vlm-grpo[{extra}]'"
    assert needed_extra("No module named 'somethingelse'") == "No module named 'somethingelse'"


def test_the_table_names_a_types_extra_and_families_all_says_when_it_is_missing(monkeypatch):
    """A type whose twin builds a timm tower records the extra; without its package `families --all` says so."""
    import importlib.util

    from vlm_grpo.adapters.families_table import missing_extras_note, model_types_table
    from vlm_grpo.adapters.generic.support import missing_extra

    needing = {t: r.extra for t, r in recorded()[1].items() if r.status == GENERIC and r.extra}
    assert needing.get("gemma3n") == "timm", needing
    row = next(line for line in model_types_table().splitlines() if line.startswith("| gemma3n |"))
    assert "needs the `timm` extra" in row
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    assert missing_extra("timm") == "needs timm: pip install 'vlm-grpo[timm]'"
    assert "  gemma3n: needs timm: pip install 'vlm-grpo[timm]'" in missing_extras_note().splitlines()


def test_each_upstream_break_still_breaks_on_the_versions_it_names():
    """An entry of upstream_breaks.py for the installed transformers: the type is refused with its reason, and its
    model, built without the refusal, still fails a forward as the entry says (a fixed break fails this test)."""
    import transformers

    from vlm_grpo.adapters.generic import support
    from vlm_grpo.adapters.generic.upstream_breaks import BREAKS, upstream_break

    for entry in BREAKS:
        if upstream_break(entry.model_type, transformers.__version__) is None:
            assert entry.model_type in recorded_mapping()  # an entry names a type the table knows
            continue
        assert entry.model_type not in generic_types()
        with pytest.raises(GenericUnsupported, match=re.escape(entry.reason)):
            support.model_class_of(entry.model_type)
        original = support.upstream_break
        try:
            support.upstream_break = lambda *_: None
            with pytest.raises(Exception, match=entry.symptom):
                tiny_adapter(entry.model_type)
        finally:
            support.upstream_break = original
