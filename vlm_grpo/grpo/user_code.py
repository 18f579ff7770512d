"""Loading code a user names on the command line: `package.module:NAME` or `path/to/file.py:NAME`.

Only the module or file named is imported (nothing is searched for or loaded by pattern), so a run executes
no code the user did not point at. Reward functions and custom recipes both come through here.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.interrupts import StopSignal


def split_spec(spec: str, what: str) -> tuple[str, str]:
    """(`module` or `file.py`, `NAME`); the last ':' splits, so a Windows drive letter stays in the path."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{what} {spec!r}: expected module:NAME or file.py:NAME")
    return module_name, name


def import_named(module_name: str, spec: str, what: str):
    """The module `module_name` (a dotted name, or a .py file executed under a private module name; registered
    in sys.modules because dataclasses and pickling look a class's module up there)."""
    if not module_name.endswith(".py"):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ValueError(f"{what} {spec!r}: cannot import {module_name}: {err}") from None
        except StopSignal:
            raise
        except BaseException as err:  # noqa: BLE001 - the module's own code failed: one line saying where
            raise ValueError(f"{what} {spec!r}: {import_failure(err, module_name)}") from None
    path = Path(module_name).expanduser()
    if not path.is_file():
        raise ValueError(f"{what} {spec!r}: no such file {path}")
    # A private name per file: two files both called rewards.py must not replace each other in sys.modules.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    key = f"vlm_grpo_user_{path.stem}_{digest}"
    loader_spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[key] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as err:  # noqa: BLE001 - reported in one line saying where
        del sys.modules[key]  # a broken file is not cached as if it had loaded
        if isinstance(err, StopSignal):
            raise  # a real SIGINT/SIGTERM, not the module's own doing
        raise ValueError(f"{what} {spec!r}: {import_failure(err, str(path))}") from None
    return module


def import_failure(err: BaseException, name: str) -> str:
    """What went wrong importing `name`, with the file and line: a syntax error, or what its top level raised."""
    if isinstance(err, SyntaxError):
        where = f"{err.filename or name}:{err.lineno}" + (f":{err.offset}" if err.offset else "")
        return f"{where}: {type(err).__name__}: {err.msg}"
    frames = traceback.extract_tb(err.__traceback__)
    inside = [f for f in frames if not f.filename.startswith("<frozen")]
    where = f" (at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""
    if isinstance(err, SystemExit):
        return f"importing {name} called sys.exit({err.code!r}){where}"
    return f"importing {name} raised {type(err).__name__}: {err}{where}"


def load_object(spec: str, what: str, noun: str = "object") -> Any:
    """The object `NAME` of the module or file `spec` names; a ValueError naming `spec` when it is not there."""
    module_name, name = split_spec(spec, what)
    module = import_named(module_name, spec, what)
    if not hasattr(module, name):
        raise ValueError(f"{what} {spec!r}: {module_name} has no {noun} {name!r}")
    return getattr(module, name)
