"""A dataset's rows, one at a time and in order, from wherever they are.

- JSONL, JSON and parquet files (and a folder holding `<split>.jsonl|json|parquet`, one such file, or the hub
  layout's single `data/<split>-*.parquet`) are read here, row by row, so that a JSON line that does not parse or
  a parquet row that does not decode is a bad row like any other, named and skippable.
- Everything else `datasets` reads is read by `datasets`: a `Dataset.save_to_disk` folder (`load_from_disk`; a
  saved DatasetDict gives the split), an `.arrow` file, a `.csv`/`.tsv` file, and any folder `load_dataset`
  understands (an imagefolder with `metadata.jsonl`/`.csv` and `file_name`, the hub layout with several
  `data/<split>-0000N-of-0000M.parquet` shards, a folder of CSV files ...), with `dataset_config` as its `name`.
- A hub id is streamed (`load_dataset(..., streaming=True)`): only the rows used are read.
- Rows given in memory (a `datasets.Dataset`, `IterableDataset`, `DatasetDict` or a list of dicts): as they are.

Image columns stay encoded (`{"bytes", "path"}` records): an image is decoded when its sample is taken, never the
whole split at once.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROW_FILES = (".jsonl", ".json", ".parquet")  # read row by row here
DATASETS_FILES = (".arrow", ".csv", ".tsv")  # read by `datasets`
DATA_SUFFIXES = ROW_FILES + DATASETS_FILES
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what `save_to_disk` leaves in its folder


@dataclass
class BadRow:
    """A row that could not be read at all (a JSON line that does not parse, a parquet row that does not decode):
    it is reported and skipped like any other bad row, in file order."""

    reason: str


@dataclass(frozen=True)
class InMemoryRows:
    """Rows given in Python (e.g. `GRPOTrainer(train_dataset=...)`), with the name messages call them by."""

    data: Any  # datasets.Dataset | IterableDataset | DatasetDict | a list of dicts
    name: str = "rows in memory"


# ------------------------------------------------------------------ files read here
def find_data_file(folder: Path, split: str) -> Path | None:
    """`<split>.jsonl|json|parquet`, the hub layout's one `data/<split>-*.parquet`, or the folder's only data file
    when it is one of those; None when the folder is for `datasets` to read."""
    for suffix in ROW_FILES:
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    hub_layout = sorted((folder / "data").glob(f"{split}-*.parquet")) if (folder / "data").is_dir() else []
    if len(hub_layout) == 1:
        return hub_layout[0]
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    # `metadata.*` beside images is datasets' imagefolder layout, not a data file of its own
    if len(found) == 1 and found[0].suffix in ROW_FILES and found[0].stem != "metadata" and not hub_layout:
        return found[0]
    return None


def iter_file(path: Path) -> Iterator[Any]:
    """The rows of a JSONL/JSON/parquet file one at a time; a row that cannot be read comes as a BadRow."""
    if path.suffix == ".jsonl":
        with open(path, "rb") as fh:  # decoded line by line: one bad byte spoils its row, not the file
            for line_no, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    yield BadRow(f"(line {line_no}) is not UTF-8 text: {_bad_byte(err)}")
                    continue
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    yield BadRow(f"(line {line_no}) is not valid JSON: {err}")
        return
    if path.suffix == ".json":  # one document: it parses whole or not at all
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text: {_bad_byte(err)}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON: {err}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json data file must hold a list of rows")
        yield from data
        return
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
            try:
                yield from batch.to_pylist()  # the whole batch at once; row by row only to find the bad ones
                continue
            except Exception:  # noqa: BLE001 - pyarrow raises many kinds for undecodable values
                pass
            for k in range(batch.num_rows):
                try:
                    yield batch.slice(k, 1).to_pylist()[0]
                except Exception as err:  # noqa: BLE001
                    yield BadRow(f"cannot be decoded: {type(err).__name__}: {err}")
        return
    raise ValueError(f"{path}: unsupported data file (use {', '.join(DATA_SUFFIXES)}, or a folder datasets reads)")


# ------------------------------------------------------------------ what datasets reads
def _by_datasets(source: str, read: Callable[[], Any]) -> Any:
    """`read()`, its failure as one ValueError naming the source (datasets raises many kinds)."""
    try:
        return read()
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{source}: datasets cannot read it: {type(err).__name__}: {err}") from None


def _bad_byte(err: UnicodeDecodeError) -> str:
    return f"byte {err.object[err.start]:#04x} at offset {err.start} (save the file as UTF-8)"


def pick_split(data: Any, split: str, source: str) -> Any:
    """One split of a DatasetDict (or IterableDatasetDict); any other dataset as it is."""
    import datasets

    if isinstance(data, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in data:
            raise ValueError(f"{source}: no split {split!r} (splits: {', '.join(data)}); set data.dataset_split "
                             "(training) or eval.split (held-out)")
        return data[split]
    return data


def _no_config(source: str, dataset_config: str | None) -> None:
    if dataset_config is not None:
        raise ValueError(f"{source}: data.dataset_config {dataset_config!r} names a configuration, and this source "
                         "has none (configurations belong to hub datasets and dataset folders with several)")


def read_local(path: Path, split: str, dataset_config: str | None) -> tuple[Any, str, Path]:
    """(rows, a name for messages, the folder relative image paths start from) of a local file or folder."""
    import datasets

    source = str(path)
    if path.is_file():
        if path.suffix in ROW_FILES:
            _no_config(source, dataset_config)
            return iter_file(path), source, path.parent
        if path.suffix == ".arrow":
            _no_config(source, dataset_config)
            return _by_datasets(source, lambda: datasets.Dataset.from_file(source)), source, path.parent
        if path.suffix in (".csv", ".tsv"):
            options = {"delimiter": "\t"} if path.suffix == ".tsv" else {}
            return _by_datasets(source, lambda: datasets.load_dataset(
                "csv", data_files=source, split="train", streaming=True, **options)), source, path.parent
        raise ValueError(f"{path}: unsupported data file (use {', '.join(DATA_SUFFIXES)}, or a folder datasets reads)")
    if any((path / marker).is_file() for marker in SAVED_MARKERS):
        _no_config(source, dataset_config)
        saved = _by_datasets(source, lambda: datasets.load_from_disk(source))
        return pick_split(saved, split, source), source, path
    single = find_data_file(path, split) if dataset_config is None else None
    if single is not None:
        return iter_file(single), str(single), single.parent
    kwargs = {"name": dataset_config} if dataset_config else {}
    read = _by_datasets(source, lambda: datasets.load_dataset(source, split=split, streaming=True, **kwargs))
    return read, source, path


def undecoded_images(dataset: Any) -> Any:
    """`dataset` with its image columns (one image or a list of them) cast to `{"bytes", "path"}` records."""
    import datasets

    features = getattr(dataset, "features", None)
    if not features or not hasattr(dataset, "cast_column"):
        return dataset
    for name, feature in features.items():
        if isinstance(feature, datasets.Image) and feature.decode:
            dataset = dataset.cast_column(name, datasets.Image(decode=False))
        elif isinstance(feature, datasets.List) and isinstance(feature.feature, datasets.Image):
            dataset = dataset.cast_column(name, datasets.List(datasets.Image(decode=False)))
    return dataset


def _named_failures(rows: Iterable[Any], source: str) -> Iterator[Any]:
    """`rows`, where a reader that fails part-way (a damaged shard) is an error naming the row it stopped at."""
    iterator = iter(rows)
    for index in itertools.count():
        try:
            row = next(iterator)
        except StopIteration:
            return
        except ValueError:  # already names the source (this module's readers, datasets' own checks)
            raise
        except Exception as err:  # noqa: BLE001 - a reader's own failure, whatever its kind
            raise ValueError(f"{source}: row {index} cannot be read: {type(err).__name__}: {err}") from None
        yield row


# ------------------------------------------------------------------ the one entry point
def read_rows(path: str | Path | None, hub_id: str | None, split: str, size: int | None,
              dataset_config: str | None = None, rows: Any = None) -> tuple[Iterable[Any], str, Path | None]:
    """(rows, a name for messages, the folder relative image paths start from), the first `size` rows (all when
    0/None). Exactly one of `path` (a local file or folder), `hub_id` and `rows` (in memory) is given."""
    if sum(x is not None for x in (path, hub_id, rows)) != 1:
        raise ValueError("give exactly one of path (a local file or folder), hub_id, or rows in memory")
    base_dir = None
    if rows is not None:
        named = rows if isinstance(rows, InMemoryRows) else InMemoryRows(rows)
        source = named.name
        _no_config(source, dataset_config)
        data = pick_split(named.data, split, source)
        if not hasattr(data, "features") and not isinstance(data, (list, tuple)):
            raise ValueError(f"{source}: expected a datasets.Dataset, IterableDataset, DatasetDict or a list of dicts, "
                             f"got {type(data).__name__}")
        found = undecoded_images(data)
    elif hub_id is not None:
        from datasets import load_dataset

        source = hub_id
        kwargs = {"name": dataset_config} if dataset_config else {}
        # Streamed, images left encoded: only the rows taken are read, and each keeps its image's bytes or path
        # (decoded when its sample is taken), so a split is never held in memory as decoded images.
        found = undecoded_images(load_dataset(hub_id, split=split, streaming=True, **kwargs))
    else:
        local = Path(path).expanduser()
        if not local.exists():
            raise ValueError(f"data path {local} does not exist")
        found, source, base_dir = read_local(local, split, dataset_config)
        found = undecoded_images(found)
    out = _named_failures(found, source)
    return (itertools.islice(out, size) if size else out), source, base_dir
