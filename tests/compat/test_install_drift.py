"""Installing on any day: a simulated fault that changes nothing is an error, the model-types table survives a newer
transformers, the KV cache is handed over under the name the installed transformers takes, the lock holds the
tested window's floor, and versions outside the window are named."""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path

import pytest
import transformers
from packaging.requirements import Requirement

from vlm_grpo.adapters import families_table
from vlm_grpo.adapters.cache_names import cache_argument, cache_keyword, returned_cache
from vlm_grpo.adapters.generic import support
from vlm_grpo.cli import main
from vlm_grpo.compat import simulated_faults, tested_window
from vlm_grpo.compat.simulated_faults import InertFault, simulated_fault

ROOT = Path(__file__).resolve().parents[2]


def test_a_fault_whose_hook_is_never_reached_is_an_error_naming_it(adapter, monkeypatch):
    """As on transformers 5.24, where the cache stopped arriving under the name the old fault read."""
    monkeypatch.setattr(simulated_faults, "find_cache", lambda args, kwargs: None)
    with pytest.raises(InertFault) as caught:
        with simulated_fault(adapter, "drop_image"):
            pytest.fail("the body of an inert fault must not run")
    message = str(caught.value)
    assert "'drop_image'" in message and adapter.family in message and transformers.__version__ in message
    assert "never reached" in message
    assert "forward" not in vars(adapter.model)  # the wrapper is gone even so


def test_a_fault_that_fires_but_changes_nothing_is_an_error(adapter, monkeypatch):
    def harmless(kind, state, layers, kwargs):
        state["fired"] += 1
        return kwargs

    monkeypatch.setattr(simulated_faults, "_corrupt", harmless)
    with pytest.raises(InertFault, match=r"changed nothing on .*agree to .*tolerance 0\.0001"):
        with simulated_fault(adapter, "shift_positions"):
            pass


@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm", "internvl"])
def test_check_cache_reports_an_inert_fault_and_exits_2(family, monkeypatch, capsys):
    monkeypatch.setattr(simulated_faults, "find_cache", lambda args, kwargs: None)
    code = main(["check-cache", "--model", f"tiny:{family}", "--simulate-quirk", "late_drop", "--steps", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"simulated fault 'late_drop' changed nothing on {family} (transformers {transformers.__version__})" in err


def test_the_check_fails_when_no_fault_is_installed(adapter):
    with simulated_fault(adapter, "drop_image"):
        pass  # entering ran the check, and it passed
    state = {"fired": 0}
    with pytest.raises(InertFault):  # no hook installed at all: nothing fires
        simulated_faults.check_fault_changes(adapter, "drop_image", state)


def test_new_model_types_are_listed_as_untested_and_the_table_does_not_move(monkeypatch):
    table = families_table.model_types_table()
    installed = dict(support.image_text_types())
    monkeypatch.setattr(support, "image_text_types", lambda: {**installed, "brand_new_vl": "BrandNewVLForConditionalGeneration"})
    assert families_table.model_types_table() == table
    note = families_table.untested_note()
    assert "brand_new_vl (BrandNewVLForConditionalGeneration)" in note and "vlm-grpo families --measure TYPE" in note


def test_a_measured_model_type_that_disappears_is_an_error(monkeypatch):
    from vlm_grpo.adapters.generic.status import recorded_mapping

    gone = sorted(recorded_mapping())[0]
    installed = {t: c for t, c in support.image_text_types().items() if t != gone}
    monkeypatch.setattr(support, "image_text_types", lambda: installed)
    with pytest.raises(families_table.ModelTypeGone, match=rf"gone from the installed transformers .*: {gone};"):
        families_table.model_types_table()


def test_the_cache_goes_under_the_name_the_callee_takes():
    def new(input_ids=None, cache=None, **kwargs): ...
    def old(input_ids=None, past_key_values=None, **kwargs): ...

    @functools.wraps(new)
    def wrapped(*args, **kwargs): ...

    assert cache_keyword(new) == "cache" and cache_keyword(wrapped) == "cache"
    assert cache_keyword(old) == "past_key_values"
    marker = object()
    assert cache_argument(new, marker) == {"cache": marker}

    class Out:
        cache = None
        past_key_values = marker

    assert returned_cache(Out()) is marker and returned_cache({"cache": marker}) is marker


def _locked() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", text, re.M)}


def _direct_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_the_lock_holds_every_direct_dependency_at_its_lower_bound_with_hashes():
    locked = {k.replace("_", "-"): v for k, v in _locked().items()}
    for req in _direct_requirements():
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert floors, f"{req.name}: pyproject gives no lower bound (the oldest version tested)"
        assert locked.get(req.name.lower().replace("_", "-")) == floors[0], f"{req.name}: lock and lower bound differ"
    blocks = (ROOT / "requirements.lock").read_text().split("\n\n")
    pins = re.findall(r"^[A-Za-z0-9_.\-]+==\S+ \\\n(?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", "\n".join(blocks), re.M)
    assert len(pins) == len(_locked()), "every pinned line carries its hashes"


def test_versions_outside_the_window_are_named_once(monkeypatch, caplog):
    monkeypatch.setattr(tested_window, "oldest_tested", lambda: {"transformers": "5.23.0", "torch": "2.14.1"})
    monkeypatch.setattr(tested_window, "newest_tested", lambda: {"transformers": "5.24.0", "torch": "2.15.0"})
    monkeypatch.setattr(tested_window, "installed", {"transformers": "5.30.0", "torch": "2.13.0"}.get)
    monkeypatch.setattr(tested_window, "_warned", set())
    lines = tested_window.outside_window()
    assert lines == ["torch 2.13.0 is older than the oldest tested (2.14.1)",
                     "transformers 5.30.0 is newer than the newest tested (5.24.0)"]
    with caplog.at_level("WARNING"):
        assert tested_window.warn_outside_window() == lines
        assert tested_window.warn_outside_window() == []  # once per process
    assert sum("transformers 5.30.0" in r.message for r in caplog.records) == 1
    monkeypatch.setattr(tested_window, "installed", {"transformers": "5.24.0", "torch": "2.14.1"}.get)
    assert tested_window.outside_window() == []
