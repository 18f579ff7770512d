"""What every recipe that reads a dataset's rows (vsr, clevr_count, mm_math, trl) takes and does: where the rows are,
which split, how many, what a bad row does, the image size; the rows read and checked once, each sample built on
access. A recipe keeps only its own row check and its own sample:

    @with_source_options
    def build(**source):
        return read_samples(check_row, to_sample, **source)

with `check_row(checker, index, row) -> record` (recipes/rows.py's RowChecker names the source, row and field of a
bad value) and `to_sample(record, image_size) -> Sample`. Such a recipe sets `Recipe(checks_rows=True)`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from vlm_grpo.recipes.base import Sample
from vlm_grpo.recipes.rows import RecordDataset, RowChecker, load_records

CheckRow = Callable[[RowChecker, int, dict], dict[str, Any]]  # a row -> its checked record (raises naming the field)
ToSample = Callable[[dict[str, Any], "int | None"], Sample]  # (a checked record, image_size) -> its Sample


def read_samples(
    check_row: CheckRow,
    to_sample: ToSample,
    split: str = "train",
    size: int | None = None,
    seed: int = 0,
    path: str | Path | None = None,
    hub_id: str | None = None,
    image_root: str | Path | None = None,
    image_size: int | None = None,
    on_bad_sample: str = "error",
    dataset_config: str | None = None,
    rows: Any = None,
) -> RecordDataset:
    """The first `size` rows of `split` (all when 0/None) from exactly one of `path` (a local file or folder),
    `hub_id` or `rows` (in memory), each checked now and made a Sample when taken. `seed` is unused: the order is the
    source's. `on_bad_sample`: error (stop, naming the row and field) or skip (leave the row out, logged)."""
    records = load_records(check_row, path, hub_id, split, size, image_root, on_bad_sample,
                           dataset_config=dataset_config, rows=rows)
    return RecordDataset(records, lambda record: to_sample(record, image_size))


SOURCE_OPTIONS = [p.replace(kind=p.KEYWORD_ONLY) for name, p in inspect.signature(read_samples).parameters.items()
                  if name not in ("check_row", "to_sample")]


def with_source_options(build: Callable) -> Callable:
    """`build(own options..., **source)` with a signature that lists the source options too: help() shows them, and
    the settings' checks (which options a recipe takes: on_bad_sample, the column names) read the signature."""
    own = [p for p in inspect.signature(build).parameters.values() if p.kind is not p.VAR_KEYWORD]
    build.__signature__ = inspect.Signature([*own, *SOURCE_OPTIONS], return_annotation=RecordDataset)
    return build
