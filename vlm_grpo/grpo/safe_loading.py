"""Reading a checkpoint's pickled state without running code: a run directory may come from someone else.

A pickle names functions for the reader to call, so unpickling a file runs whatever its writer chose; a checkpoint's
manifest does not help (whoever writes a file writes its manifest). So:
- torch.save files (the optimizer, scheduler and RNG state) are read by `torch.load(weights_only=True)`, torch's
  own restricted unpickler: tensors, numbers, strings, None and their tuples, lists and dicts; anything else is
  refused before it is built. Our checkpoints hold only those; no extra safe globals are registered.
- other pickles (a sharded checkpoint's DCP metadata) go through `RestrictedUnpickler`, which resolves only the
  names its caller lists (record classes, `torch.Size`, dtypes), refuses every other global, and sets state only
  on instances of those classes (torch's weights-only reader cannot read DCP's pickle protocol).
- `trust=True` (`--trust-checkpoint`) is the one explicit full unpickling, for a checkpoint its user wrote or
  trusts whose files the safe readers refuse (e.g. one holding numpy arrays): `load_state_file` here, and torch's
  own DCP reader for a sharded checkpoint (grpo/checkpoint/sharded.py).
"""

from __future__ import annotations

import pickle
import sys
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

TRUST_HINT = ("resume with --trust-checkpoint only if you wrote this checkpoint or trust who did (its files are then "
              "unpickled in full; the checkpoints this run writes are plain data)")


class UnsafeCheckpointFile(RuntimeError):
    """A checkpoint file that is not plain data: reading it would run code its writer chose."""

    def __init__(self, where: str, reason: str):
        super().__init__(where, reason)  # both in args: the error crosses processes (pickled) whole

    def __str__(self) -> str:
        where, reason = self.args
        return f"{where} is not plain data ({reason}): refusing to unpickle it, a pickle can run code; {TRUST_HINT}"


def _reason(err: Exception) -> str:
    """torch's long weights-only refusal, cut to what the file asked for."""
    text = str(err)
    named = re.search(r"GLOBAL ([\w.]+)", text)
    if named:
        return f"it names {named.group(1)}"
    if "Unsupported operand" in text:
        return "it is not a torch.save file of tensors and plain values"
    return text.strip().splitlines()[-1][:200] if text.strip() else type(err).__name__


def load_state_file(path: Path | str | BinaryIO, trust: bool = False, where: str | None = None) -> Any:
    """A torch.save file (or stream) read as plain data; `where` names it in the refusal (default: the path)."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        if not trust:
            raise UnsafeCheckpointFile(where or str(path), _reason(err)) from None
    warn_trusted(where or str(path))
    return torch.load(path, weights_only=False)  # --trust-checkpoint: the user vouched for this checkpoint


def warn_trusted(what: str) -> None:
    """One warning per file --trust-checkpoint unpickles in full: what runs is named before it runs."""
    print(f"warning: --trust-checkpoint: unpickling {what} in full (any code it holds runs now)", file=sys.stderr)


class RestrictedUnpickler(pickle._Unpickler):  # the pure-Python reader: its BUILD step can be guarded
    """A pickle reader that resolves only the names in `allowed` ((module, name) pairs) and dtypes of torch, and
    sets state only on instances of those classes: it builds records, calls nothing else, and changes no class or
    function (the pattern of the pickle module's documentation, with BUILD guarded too)."""

    def __init__(self, file: BinaryIO, allowed: set[tuple[str, str]], where: str):
        super().__init__(file)
        self.allowed, self.where, self.classes = allowed, where, set()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            found = super().find_class(module, name)
            if isinstance(found, type):
                self.classes.add(found)
            return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointFile(self.where, f"it names {module}.{name}")

    def load_build(self) -> None:
        target = self.stack[-2]  # [..., target, state]
        if type(target) not in self.classes:
            raise UnsafeCheckpointFile(self.where, f"it sets the state of {type(target).__name__} {target!r:.60}")
        super().load_build()

    dispatch = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: load_build}


def load_records(path: Path, allowed: set[tuple[str, str]], expect: type,
                 check: Callable[[Any], str | None] = lambda _: None) -> Any:
    """An `expect` instance unpickled from `path` with only `allowed` names; `check` returns what is wrong with it."""
    with open(path, "rb") as fh:
        try:
            value = RestrictedUnpickler(fh, allowed, str(path)).load()
        except (UnsafeCheckpointFile, OSError):
            raise
        except Exception as err:  # noqa: BLE001 - pickle raises many kinds for a damaged stream
            raise ValueError(f"{path} cannot be read: {type(err).__name__}: {err}") from None
    problem = f"it holds a {type(value).__name__}, not a {expect.__name__}" if not isinstance(value, expect) else check(value)
    if problem:
        raise UnsafeCheckpointFile(str(path), problem)
    return value
