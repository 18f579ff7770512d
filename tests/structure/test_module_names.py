"""A module's name says its job once: inside the loop (grpo/) and the Python API (api/) no two files or folders share
a name (a plural counts as its singular), so `scoring` or `checkpoints` never means two things. A plug-in kind's
`base.py` (the class each registered plug-in derives from) is the one name that repeats; the areas' own names are not
counted (a registered loss is a file named after it: algorithm/losses/grpo.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import vlm_grpo

ROOT = Path(vlm_grpo.__file__).resolve().parent
AREAS = ("grpo", "api")
REPEATABLE = {"__init__", "base"}


def _stem(name: str) -> str:
    return name[:-1] if name.endswith("s") and not name.endswith("ss") else name


def repeated_names(root: Path = ROOT, areas=AREAS) -> dict[str, list[str]]:
    """{name: its paths} of every file or folder name used more than once in `areas` (plural and singular alike)."""
    seen: dict[str, list[str]] = defaultdict(list)
    for area in areas:
        base = root / area
        for path in sorted(base.rglob("*")):
            if "__pycache__" in path.parts or (path.is_file() and path.suffix != ".py"):
                continue
            name = path.stem if path.is_file() else path.name
            if name not in REPEATABLE:
                seen[_stem(name)].append(str(path.relative_to(root)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_two_modules_of_one_name_in_the_loop_and_the_api():
    assert repeated_names() == {}


def test_the_check_sees_a_repeated_name(tmp_path):
    """The check itself: a `scoring.py` in two folders, and a `checkpoints.py` beside a `checkpoint/` folder."""
    for path in ("grpo/parts/scoring.py", "grpo/rewards/scoring.py", "grpo/checkpoint/store.py",
                 "api/checkpoints.py", "grpo/algorithm/losses/base.py", "grpo/algorithm/advantages/base.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert repeated_names(tmp_path) == {
        "scoring": ["grpo/parts/scoring.py", "grpo/rewards/scoring.py"],
        "checkpoint": ["grpo/checkpoint", "api/checkpoints.py"],
    }
