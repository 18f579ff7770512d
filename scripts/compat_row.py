"""Record one run of the whole suite in docs/compatibility.md (and, for a green run on the newest releases, the
newest tested versions in vlm_grpo/compat/tested_window.json).

    python scripts/compat_row.py JUNIT_XML locked|latest

Called by `make test-latest`; run it by hand after a `make test` to add a locked row
(`python -m pytest ... --junitxml=J` first).
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "compatibility.md"
WINDOW = ROOT / "vlm_grpo" / "compat" / "tested_window.json"
SHOWN = ("torch", "torchvision", "transformers", "accelerate", "peft", "datasets", "trl", "numpy", "pillow")
MARK = "<!-- compatibility-rows -->"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def _counts(junit: Path) -> tuple[int, int, int, float]:
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    seconds = sum(float(s.get("time", 0)) for s in suites)
    return total - failed - skipped, failed, skipped, seconds


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("locked", "latest"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    junit, kind = Path(argv[0]), argv[1]
    if not junit.is_file():
        print(f"error: no test report at {junit}: the suite did not run", file=sys.stderr)
        return 2
    passed, failed, skipped, seconds = _counts(junit)
    today = datetime.date.today().isoformat()
    versions = ", ".join(f"{p} {_version(p)}" for p in SHOWN)
    row = (f"| {today} | {kind} | python {platform.python_version()}, {versions} | {passed} | {failed} | {skipped} "
           f"| {seconds / 60:.1f} min |")
    text = TABLE.read_text()
    TABLE.write_text(text.replace(MARK, MARK + "\n" + row, 1))
    print(f"docs/compatibility.md: {row}")
    if kind == "latest" and failed == 0 and passed > 0:
        window = json.loads(WINDOW.read_text())
        window["date"], window["newest"] = today, {p: _version(p) for p in SHOWN if _version(p) != "-"}
        WINDOW.write_text(json.dumps(window, indent=1) + "\n")
        print(f"{WINDOW.relative_to(ROOT)}: newest tested = {window['newest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
