"""Small files with one job each: no module of the package over 400 lines, no family adapter over 250."""

from __future__ import annotations

from pathlib import Path

import vlm_grpo

ROOT = Path(vlm_grpo.__file__).resolve().parent


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): _lines(p) for p in ROOT.rglob("*.py") if _lines(p) > 400}
    assert not long, long


def test_no_family_file_over_250_lines():
    long = {p.name: _lines(p) for p in (ROOT / "adapters" / "families").glob("*.py") if _lines(p) > 250}
    assert not long, long
