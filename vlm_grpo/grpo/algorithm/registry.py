"""A registry of algorithm parts (losses, advantage estimators) by name, which also loads a user's own part.

The parts of the library register themselves when their package scans its folder (one file each, see the
packages' `__init__`). A setting may also name a class outside the library as `package.module:Class` (or
`file.py:Class`): looking it up imports it and checks it against the documented base class, without adding it to
the registry, so tables and `--help` list the library's parts only. Lookups of names that are neither raise
`SettingError` naming the setting.
"""

from __future__ import annotations

from typing import Callable

from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.user_code import load_object


class Registry(dict):
    """name -> class; `registry[key]` also resolves `package.module:Class` (imported, checked, not stored)."""

    def __init__(self, kind: str, setting: str, base: Callable[[], type],
                 check: Callable[[type, bool], None] | None = None):
        super().__init__()
        # `base` is a function: the base class is defined beside the registry, after it. `check(cls, imported)`
        # raises ValueError for a class that cannot work (imported: loaded from a path, not registered)
        self.kind, self.setting, self._base, self._check = kind, setting, base, check

    def add(self, cls: type) -> type:
        if self._check is not None:
            self._check(cls, False)
        if cls.name in self:
            raise ValueError(f"two {self.kind}s are registered as {cls.name!r}")
        self[cls.name] = cls
        return cls

    def __missing__(self, key):
        names = ", ".join(sorted(self))
        if not isinstance(key, str) or ":" not in key:
            raise SettingError(self.setting, f"{key!r} is not one of {names}, nor a package.module:Class path")
        try:
            obj = load_object(key, what="", noun="class")
        except ValueError as err:  # "'KEY': " and what failed: the module, its code, or the missing class
            raise SettingError(self.setting, f"{str(err).strip()}; a {self.kind} is one of {names} or a "
                               "package.module:Class on the Python path") from None
        base = self._base()
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise SettingError(self.setting, f"{key!r} is not a subclass of {base.__module__}.{base.__name__}, the "
                               f"base class of every {self.kind} (docs/algorithms.md)")
        if self._check is not None:
            try:
                self._check(obj, True)
            except ValueError as err:
                raise SettingError(self.setting, f"{key!r}: {err}") from None
        return obj
