"""The cache probe and the `auto` policy: pass today, catch a simulated quirk, honour the table."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.cli import main
from vlm_grpo.compat import cache_policy
from vlm_grpo.compat.cache_policy import resolve_use_cache
from vlm_grpo.compat.cache_probe import CacheProbeReport, probe_cache
from vlm_grpo.compat.known_quirks import known_cache_quirk
from vlm_grpo.compat.simulated_faults import IMAGE_FAULTS, simulated_fault
from vlm_grpo.loader import apply_cache_policy
from vlm_grpo.grpo.logprobs.completions import completion_logprobs, token_logprobs
from tests.adapters.samples import picture, user_turn
from tests.conftest import _families, covering_pairs, tiny_adapter
from vlm_grpo.adapters.registry import family_class


def test_every_family_passes_the_probe_today(adapter):
    report = probe_cache(adapter, steps=3)
    assert report.cache_ok and report.path_ok(False), report.table()
    assert not report.blind, report.table()


def test_simulated_quirk_is_caught_and_auto_switches_off_the_cache(adapter):
    fresh = type(adapter)(adapter.model, adapter.processor)
    with simulated_fault(fresh, "drop_image"):
        report = probe_cache(fresh, steps=3)
        assert not report.cache_ok, report.table()
        assert report.path_ok(False), report.table()
        assert apply_cache_policy(fresh, "auto") is False and fresh.use_cache is False

        batch = fresh.encode_prompts([user_turn(1, "Count the squares.")], [[picture(56, 56, 5)]])
        out = fresh.generate(batch, max_new_tokens=4, min_new_tokens=4, output_logits=True)
        completion = out.sequences[:, batch.input_ids.shape[1] :]
        with torch.no_grad():
            forward = completion_logprobs(fresh, batch, completion, torch.ones_like(completion))
        generated = token_logprobs(torch.stack(out.logits, dim=1), completion)
        assert (forward - generated).abs().max().item() <= 1e-4

        # the same quirk with the cache forced on really does corrupt generation
        forced = fresh.generate(batch, max_new_tokens=4, min_new_tokens=4, output_logits=True, use_cache=True)
        forced_lp = token_logprobs(torch.stack(forced.logits, dim=1), forced.sequences[:, batch.input_ids.shape[1] :])
        with torch.no_grad():
            truth = completion_logprobs(fresh, batch, forced.sequences[:, batch.input_ids.shape[1] :], torch.ones_like(completion))
        assert (truth - forced_lp).abs().max().item() > 1e-3
    # the patch is gone once the context exits
    assert "forward" not in vars(adapter.model)


@pytest.mark.parametrize("family, kind", covering_pairs(_families(), list(IMAGE_FAULTS), 2, "fault_matrix"))
def test_every_simulated_fault_is_caught(family, kind):
    """Faults that shift, reorder, mask or (late) drop what cached decoding sees, and NaN weights: each fails the
    cached path, while the uncached path (untouched but for NaN weights) still agrees. Each family under 2 faults
    and each fault on 5-6 families here; every pair under `-m fault_matrix`."""
    adapter = tiny_adapter(family)
    with simulated_fault(adapter, kind):
        report = probe_cache(adapter)
    assert not report.cache_ok, report.table()
    if kind == "nan_weights":
        assert not report.finite and not report.path_ok(False) and "NON-FINITE" in report.table()
    else:
        assert report.finite and report.path_ok(False), report.table()
    assert report.steps == 16  # the late fault starts at step 6: a 4-step probe would miss it


def test_no_false_alarm_in_bfloat16(family):
    adapter = type(tiny_adapter(family)).tiny(seed=0)  # a copy: the shared twin stays float32
    adapter.model.to(torch.bfloat16)
    report = probe_cache(adapter)
    assert report.cache_ok and report.path_ok(False), report.table()
    assert report.tolerance >= 2e-2 and not report.blind


def test_tolerance_comes_from_the_measured_noise():
    report = probe_cache(tiny_adapter("qwen2_5_vl"))
    assert 0 < report.noise < 1e-5 and report.tolerance == max(10 * report.noise, 1e-5)
    assert report.cached_diff <= report.tolerance < 1e-4  # a position shift (>= 3e-4) cannot hide under it


def test_known_quirk_table_skips_the_probe(monkeypatch):
    smolvlm, idefics3 = family_class("smolvlm"), family_class("idefics3")
    assert known_cache_quirk(smolvlm, "4.49.0") is not None
    assert known_cache_quirk(idefics3, "4.46.1") is not None
    assert known_cache_quirk(family_class("qwen2_5_vl"), "4.49.0") is None
    assert known_cache_quirk(smolvlm, "5.23.0") is None

    class Stub:
        family = "smolvlm"
        cache_quirks = smolvlm.cache_quirks

    monkeypatch.setattr(cache_policy.transformers, "__version__", "4.49.0")
    monkeypatch.setattr(cache_policy, "probe_cache", lambda *a, **k: pytest.fail("auto must not probe a known quirk"))
    assert resolve_use_cache(Stub(), "auto") is False
    assert resolve_use_cache(Stub(), "cache") is True
    assert resolve_use_cache(Stub(), "no-cache") is False
    with pytest.raises(ValueError, match="auto, cache, no-cache"):
        resolve_use_cache(Stub(), "sometimes")


def test_quirk_entries_live_in_family_files_and_the_generic_adapter_has_none():
    """A cache quirk is declared by the family it concerns; for a model type without a family file the probe alone
    decides."""
    from vlm_grpo.adapters.generic.adapter import generic_adapter_class
    from vlm_grpo.adapters.registry import families

    declaring = sorted(name for name, cls in families().items() if cls.cache_quirks)
    assert declaring == ["idefics3", "smolvlm"]
    assert generic_adapter_class("idefics2").cache_quirks == ()


def test_report_verdicts():
    common = dict(family="x", transformers_version="5", steps=3, tolerance=1e-3)
    blind = CacheProbeReport(cached_diff=0.0, uncached_diff=0.0, control_diff=1e-4, **common)
    assert blind.blind and not blind.cache_ok and "BLIND" in blind.table()
    broken = CacheProbeReport(cached_diff=0.5, uncached_diff=1e-7, control_diff=0.3, **common)
    assert not broken.cache_ok and broken.path_ok(False) and "DISAGREES" in broken.table()
    with pytest.raises(ValueError, match="at least 2"):
        probe_cache(object(), steps=1)


def test_check_cache_command(family, capsys):
    assert main(["check-cache", "--model", f"tiny:{family}", "--steps", "3"]) == 0
    assert "generate, KV cache" in capsys.readouterr().out


def test_check_cache_command_fails_when_the_used_path_disagrees(capsys):
    args = ["check-cache", "--model", "tiny:qwen2_5_vl", "--steps", "3", "--simulate-quirk"]
    assert main(args + ["--cache-policy", "cache"]) == 1
    assert main(args + ["--cache-policy", "auto"]) == 0  # auto falls back to no-cache, which agrees
    assert "generation uses no cache" in capsys.readouterr().out
