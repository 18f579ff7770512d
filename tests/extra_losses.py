"""Loss files outside the package found as if they sat in vlm_grpo/grpo/algorithm/losses/: the package's search
path gets a second folder before the package is first imported, so its own scan (pkgutil over `__path__`) finds
them, and the registry, the settings, `--help`, the tables and every test loop see them through the real discovery.
Call `add_loss_folder` first thing in a fresh process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "vlm_grpo.grpo.algorithm.losses"


def add_loss_folder(folder: str | Path) -> None:
    assert PACKAGE not in sys.modules, "the losses package was already imported: its folders are fixed"
    import vlm_grpo.grpo.algorithm

    real = Path(vlm_grpo.grpo.algorithm.__file__).parent / "losses"
    spec = importlib.util.spec_from_file_location(PACKAGE, real / "__init__.py",
                                                  submodule_search_locations=[str(real), str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
