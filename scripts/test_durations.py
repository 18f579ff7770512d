"""Write tests/durations.json (test id -> seconds) from a pytest JUnit XML report, for `make test-fast`'s selection.

    python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml && python scripts/test_durations.py /tmp/junit.xml

`make durations` does both. `--merge` keeps the file's other entries and replaces those the report has (a report of
some test files only: their times are then measured without the rest of the suite beside them). A test missing from the file (a new one) runs in the fast tier until the file is
refreshed; a test recorded slower than tests/conftest.py's FAST_SECONDS does not. A class- or module-scoped
fixture is set up by whichever of its tests runs first, so the slowest setup among its tests (tests/conftest.py
records each test's setup and shared fixtures) is charged to every test that uses it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def node_id(classname: str, name: str) -> str:
    """`tests.grpo.test_x[.Class]` + `test_y[p]` -> `tests/grpo/test_x.py[::Class]::test_y[p]`."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (ROOT / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return f"{classname}::{name}"


def main(argv: list[str]) -> int:
    merge = "--merge" in argv
    argv = [a for a in argv if a != "--merge"]
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    times, uses, setup_cost = {}, {}, {}
    for case in ET.parse(argv[0]).getroot().iter("testcase"):
        test = node_id(case.get("classname", ""), case.get("name", ""))
        times[test] = round(float(case.get("time", 0)), 3)
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        uses[test] = [f for f in (props.get("shared_fixtures") or "").split(",") if f]
        for fixture in uses[test]:
            setup_cost[(test.split("::")[0], fixture)] = max(setup_cost.get((test.split("::")[0], fixture), 0.0),
                                                            float(props.get("setup_seconds") or 0.0))
    for test, fixtures in uses.items():
        charged = [setup_cost[(test.split("::")[0], f)] for f in fixtures]
        times[test] = round(max([times[test], *charged]), 3)
    if merge:
        times = {**json.loads(OUT.read_text()), **times}
    OUT.write_text(json.dumps(dict(sorted(times.items())), indent=0) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(times)} tests, {sum(times.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
