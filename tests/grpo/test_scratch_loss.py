"""A loss added as one file shows up everywhere the losses are listed, with nothing else edited: `vlm-grpo train
--help`, the tables of README.md and docs/algorithms.md (rendered from the registry), the TRL parity loops and the
reference loops of the tests, and the training matrix. The file goes into a second folder of the losses package's
search path (tests/extra_losses.py), so the package's own scan finds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# grpo's arithmetic under a new name, declaring TRL's grpo as its counterpart: the parity loops must pick it up and
# it must pass them.
SCRATCH = '''
from vlm_grpo.grpo.algorithm.losses.base import register
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class ScratchGRPO(ClippedSurrogate):
    name = "scratch_grpo"
    trl_loss_type = "grpo"
    summary = "a scratch copy of grpo"
    paper = "none (a test)"
    normalisation = "sequence"
'''

PROBE = r'''
import contextlib, io, json, sys
from pathlib import Path
from tests.extra_losses import add_loss_folder
add_loss_folder(sys.argv[1])
import pytest
from vlm_grpo.cli import main
from vlm_grpo.commands.docs_tables import render

found = {}
help_text = io.StringIO()
with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):  # argparse exits after help
    main(["train", "--help"])
found["help"] = [line.strip() for line in help_text.getvalue().splitlines() if "scratch_grpo" in line]
found["docs"] = [line for page in ("README.md", "docs/algorithms.md")
                 for line in render(Path(page).read_text()).splitlines() if "`scratch_grpo`" in line]
runs = {}
class Record:
    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            runs[report.nodeid] = report.outcome
    def pytest_collection_finish(self, session):
        runs.update({item.nodeid: "collected" for item in session.items})
code = pytest.main(["-q", "-p", "no:cacheprovider", "-k", "scratch_grpo", "tests/grpo/test_loss_parity_trl.py",
                    "tests/grpo/test_algorithm_references.py"], plugins=[Record()])
collected = pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", "-k", "scratch_grpo",
                         "tests/grpo/test_algorithms_train.py"], plugins=[Record()])
found["tests"], found["exit_codes"] = runs, [int(code), int(collected)]
print("FOUND " + json.dumps(found))
'''


def test_a_loss_added_as_one_file_shows_up_everywhere(tmp_path):
    (tmp_path / "scratch_grpo.py").write_text(SCRATCH)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(done.stdout.split("FOUND ", 1)[1])
    assert found["exit_codes"] == [0, 0], done.stdout[-3000:]
    assert any(line.startswith("--loss.loss_type") for line in found["help"]), found["help"]
    assert len(found["docs"]) == 2 and all("a scratch copy of grpo" in line for line in found["docs"])
    tests = found["tests"]
    parity = [t for t in tests if "test_loss_parity_trl.py::" in t]
    # every parity loop over losses: plain, each option, the adaptive entropy coefficient
    for loop in ("test_loss_and_grad_match_trl", "test_every_option_matches_trl",
                 "test_adaptive_entropy_coefficient_evolves_as_trl_s"):
        assert any(f"::{loop}[" in t for t in parity), loop
    assert all(tests[t] == "passed" for t in parity)
    references = [t for t in tests if "test_algorithm_references.py::" in t]
    assert references and all(tests[t] == "passed" for t in references)
    assert any("test_every_loss_and_estimator_trains_two_steps[scratch_grpo]" in t for t in tests)
