"""Rows for file-based recipes: read them (JSONL, JSON, parquet, a folder, or a hub dataset), check each
one, and turn the checked records into Samples lazily.

Every problem is a `ValueError` that names the source, the row index and the field, so a bad row in a
70k-row file is found without a debugger. Images may be PIL images, bytes, file paths or the hub's
`{"bytes": ..., "path": ...}` dicts; paths are resolved against `image_root`, then the data file's folder,
then its `images/` subfolder. Images are checked (header read) when the set is built and decoded to RGB
when a sample is taken.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from PIL import Image

from vlm_grpo.images import BadImage, prepare
from vlm_grpo.recipes.base import Sample

log = logging.getLogger(__name__)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer string is not a file path (an inline image, base64 without data:)


# ------------------------------------------------------------------ reading
def find_data_file(folder: Path, split: str) -> Path:
    """`<split>.jsonl|json|parquet`, the hub layout `data/<split>-*.parquet`, or the folder's only data file."""
    for suffix in DATA_SUFFIXES:
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    hub_layout = sorted((folder / "data").glob(f"{split}-*.parquet")) if (folder / "data").is_dir() else []
    if len(hub_layout) == 1:
        return hub_layout[0]
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    if len(found) == 1:
        return found[0]
    names = ", ".join(p.name for p in found) or "none"
    raise ValueError(f"{folder}: no {split}.jsonl/.json/.parquet and not exactly one data file (found: {names})")


@dataclass
class BadRow:
    """A row that could not be read at all (a JSON line that does not parse, a parquet row that does not decode):
    it is reported and skipped like any other bad row, in file order."""

    reason: str


def iter_file(path: Path) -> Iterator[Any]:
    """The rows of a data file one at a time; a row that cannot be read comes as a BadRow."""
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
    raise ValueError(f"{path}: unsupported data file (use {', '.join(DATA_SUFFIXES)})")


def _bad_byte(err: UnicodeDecodeError) -> str:
    return f"byte {err.object[err.start]:#04x} at offset {err.start} (save the file as UTF-8)"


def read_rows(path: str | Path | None, hub_id: str | None, split: str, size: int | None) -> tuple[Iterable[Any], str, Path | None]:
    """(rows, a name for messages, the folder relative image paths start from). Files are read row by row."""
    if (path is None) == (hub_id is None):
        raise ValueError("give exactly one of path (a local JSONL/JSON/parquet file or folder) and hub_id")
    if hub_id is not None:
        from datasets import load_dataset

        # Streamed, images left encoded: only the rows taken are read, and each keeps its image's bytes or path
        # (decoded when its sample is taken), so a split is never held in memory as decoded images.
        rows = iter(undecoded_images(load_dataset(hub_id, split=split, streaming=True)))
        return (itertools.islice(rows, size) if size else rows), hub_id, None
    path = Path(path).expanduser()
    if path.is_dir():
        path = find_data_file(path, split)
    elif not path.is_file():
        raise ValueError(f"data path {path} does not exist")
    rows = iter_file(path)
    return (itertools.islice(rows, size) if size else rows), str(path), path.parent


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


# ----------------------------------------------------------------- checking
@dataclass
class RowChecker:
    """Checks one source's rows; every message names the source, row and field."""

    source: str
    base_dir: Path | None = None
    image_root: Path | None = None

    def fail(self, index: int, name: str, problem: str) -> ValueError:
        return ValueError(f"{self.source}: row {index}: field {name!r} {problem}")

    def row(self, index: int, row: Any) -> dict[str, Any]:
        if not isinstance(row, dict):
            raise ValueError(f"{self.source}: row {index} is a {type(row).__name__}, not a mapping of fields")
        return row

    def text(self, index: int, row: dict, name: str, required: bool = True) -> str | None:
        if name not in row or row[name] is None:
            if required:
                raise self.fail(index, name, "is missing")
            return None
        value = row[name]
        if not isinstance(value, str):
            raise self.fail(index, name, f"must be a string, got {type(value).__name__}")
        if not value.strip():
            raise self.fail(index, name, "is empty")
        return value

    def image(self, index: int, row: dict, names: tuple[str, ...]) -> "ImageRef":
        """The first of `names` present in the row, checked to be a readable image."""
        name = next((n for n in names if row.get(n) is not None), None)
        if name is None:
            raise self.fail(index, " or ".join(names), "is missing")
        value = row[name]
        if isinstance(value, list) and len(value) == 1:  # some sets store one image as a one-item list
            value = value[0]
        where = f"{self.source}: row {index}: field {name!r}"
        if isinstance(value, Image.Image):
            ref = ImageRef(image=value, where=where)
            try:
                ref.probe()
            except BadImage as err:
                raise self.fail(index, name, str(err)) from None
            return ref
        if isinstance(value, dict):
            if value.get("bytes"):
                value = value["bytes"]
            elif value.get("path"):
                value = value["path"]
            else:
                raise self.fail(index, name, "is an image mapping with neither bytes nor path")
        if isinstance(value, str) and value.startswith("data:"):
            ref = ImageRef(data=self._data_uri(index, name, value), where=where)
        elif isinstance(value, (bytes, bytearray)):
            ref = ImageRef(data=bytes(value), where=where)
        elif isinstance(value, str) and len(value) > MAX_PATH_CHARS:
            raise self.fail(index, name, f"is a string of {len(value)} characters starting {value[:24]!r}: neither an "
                            "image file path nor a data: URI (data:image/png;base64,...)")
        elif isinstance(value, (str, Path)):
            ref = ImageRef(path=self._resolve(index, name, Path(value)), where=where)
        else:
            raise self.fail(index, name, f"must be an image, bytes or a file path, got {type(value).__name__}")
        try:
            ref.probe()
        except Exception as err:  # noqa: BLE001 - any decoder failure means the image is unusable
            where = f" ({ref.path})" if ref.path else ""
            raise self.fail(index, name, f"is not a readable image{where}: {err}") from None
        return ref

    def _data_uri(self, index: int, name: str, uri: str) -> bytes:
        """The bytes of a `data:[<type>][;base64],<data>` URI (RFC 2397), as transformers' load_image reads them."""
        header, sep, payload = uri.partition(",")
        if not sep:
            raise self.fail(index, name, f"is a data: URI without the comma before its data ({uri[:40]!r})")
        if not header.endswith(";base64"):
            raise self.fail(index, name, f"is a data: URI that is not base64 ({header!r}); images are binary")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as err:
            raise self.fail(index, name, f"is a data: URI whose base64 does not decode: {err}") from None

    def _resolve(self, index: int, name: str, path: Path) -> Path:
        path = path.expanduser()
        if path.is_absolute():
            candidates = [path]
        else:
            roots = [r for r in (self.image_root, self.base_dir, self.base_dir / "images" if self.base_dir else None) if r]
            candidates = [root / path for root in roots] or [path]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise self.fail(index, name, f"names an image file that does not exist: {', '.join(map(str, candidates))}")


@dataclass
class ImageRef:
    """An image to decode when the sample is taken (a PIL image, encoded bytes or a file)."""

    image: Image.Image | None = None
    data: bytes | None = None
    path: Path | None = None
    where: str = "image"  # "<source>: row N: field 'image'", for messages raised at decode time

    def _open(self) -> Image.Image:
        if self.image is not None:
            return self.image
        return Image.open(io.BytesIO(self.data) if self.data is not None else self.path)

    def probe(self) -> None:
        img = self._open()
        if img.width == 0 or img.height == 0:  # the header has been parsed
            raise BadImage(f"has zero size ({img.width}x{img.height})")

    def load(self, max_side: int | None = None) -> Image.Image:
        try:
            img = prepare(self._open())
        except (BadImage, OSError) as err:
            raise ValueError(f"{self.where}: {err}") from None
        if max_side and max(img.size) != max_side:
            scale = max_side / max(img.size)
            img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BILINEAR)
        return img


# ------------------------------------------------------------------ samples
@dataclass
class RecordDataset:
    """Checked records; `to_sample(record)` builds the Sample (and decodes its image) on access."""

    records: list[dict[str, Any]]
    to_sample: Callable[[dict[str, Any]], Sample]

    def where(self, index: int) -> str:
        """`<source>: row N` for record `index` (N counts the source's rows, bad ones included)."""
        rows, source = getattr(self.records, "rows", None), getattr(self.records, "source", None)
        return f"{source}: row {rows[index]}" if rows is not None and source else f"row {index}"

    @property
    def skipped_rows(self) -> dict[int, str]:
        """Rows the loader left out as bad (skip mode), by their index in the source."""
        return getattr(self.records, "skipped", {})

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < len(self.records):
            raise IndexError(index)
        return self.to_sample(self.records[index])


def load_records(
    check: Callable[[RowChecker, int, dict], dict[str, Any]],
    path: str | Path | None,
    hub_id: str | None,
    split: str,
    size: int | None,
    image_root: str | Path | None = None,
    on_bad_sample: str = "error",
) -> list[dict[str, Any]]:
    """Read the rows and run `check(checker, index, row)` on each; raises if there are none.

    on_bad_sample="skip": a bad row is left out instead of stopping the run; how many and which is logged.
    """
    if on_bad_sample not in ("error", "skip"):
        raise ValueError(f"on_bad_sample must be error or skip, not {on_bad_sample!r}")
    rows, source, base_dir = read_rows(path, hub_id, split, size)
    checker = RowChecker(source, base_dir, Path(image_root).expanduser() if image_root else None)
    records, skipped, numbers = [], [], []
    for i, row in enumerate(rows):
        try:
            if isinstance(row, BadRow):
                raise ValueError(f"{source}: row {i} {row.reason}")
            records.append(check(checker, i, checker.row(i, row)))
            numbers.append(i)
        except ValueError as err:
            if on_bad_sample == "error":
                raise
            skipped.append((i, str(err)))
    if skipped:
        log.warning("%s: skipped %d bad rows (on_bad_sample=skip): %s", source, len(skipped), "; ".join(m for _, m in skipped[:20]))
    if not records:
        raise ValueError(f"{source}: no usable rows" + (f" ({len(skipped)} skipped as bad)" if skipped else ""))
    return Records(records, skipped=dict(skipped), rows=numbers, source=source)


class Records(list):
    """Checked records, plus the rows left out as bad (row index -> reason) in skip mode, each record's row number
    in the source and the source's name (for messages about a record)."""

    def __init__(self, items, skipped: dict[int, str] | None = None, rows: list[int] | None = None, source: str = ""):
        super().__init__(items)
        self.skipped = skipped or {}
        self.rows = rows
        self.source = source
