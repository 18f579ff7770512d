"""What the trainers' TRL surface (api/trl_trainer.py, api/trainers.py) is built from: `settable`, for TRL's plain trainer
attributes that scripts replace (a stub accelerator, a mocked model: once set, the instance's own value is read back
while the run keeps its own parts), and the rows a data loader reads."""

from __future__ import annotations


import torch


class settable:
    """A read-through attribute that an assignment replaces for this instance (TRL's attributes are plain)."""

    def __init__(self, fget):
        self.fget, self.__doc__, self.name = fget, fget.__doc__, fget.__name__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return self.fget(obj)

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


def as_list(batch: list) -> list:
    """A loader's collate function: the rows as they are (prompts, images, columns), one list per batch."""
    return batch


class LoaderRows(torch.utils.data.Dataset):
    """`source`'s rows in `order`: what a TRL script's data loader iterates."""

    def __init__(self, source, order: list[int]):
        self.source, self.order = source, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int):
        return self.source[self.order[k]]
