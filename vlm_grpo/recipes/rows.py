"""Rows for file-based recipes: read them (recipes/readers.py: files, folders, anything `datasets` reads, a hub
dataset, rows in memory), check each one, and turn the checked records into Samples lazily.

Every problem is a `ValueError` that names the source, the row index and the field, so a bad row in a
70k-row file is found without a debugger. Images may be PIL images, bytes, file paths or the hub's
`{"bytes": ..., "path": ...}` dicts; paths are resolved against `image_root`, then the data file's folder,
then its `images/` subfolder. A hub dataset's rows are not trusted with local paths: their image paths resolve
only to that dataset's own files (fetched into the hub cache) or, given `image_root`, to files inside it; an
absolute path, `~`, `..` or another repo is a bad row. Images are checked (header read) when the set is built
and decoded to RGB when a sample is taken.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Callable

from PIL import Image

from vlm_grpo.file_kinds import special_kind
from vlm_grpo.images import BadImage, prepare
from vlm_grpo.recipes.base import Sample
from vlm_grpo.recipes.readers import BadRow, read_rows

log = logging.getLogger(__name__)
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer string is not a file path (an inline image, base64 without data:)


# ----------------------------------------------------------------- checking
@dataclass
class RowChecker:
    """Checks one source's rows; every message names the source, row and field."""

    source: str
    base_dir: Path | None = None
    image_root: Path | None = None
    hub_id: str | None = None  # rows from this hub dataset: their image paths stay inside it (or image_root)

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
            resolve = self._resolve if self.hub_id is None else self._dataset_file
            ref = ImageRef(path=resolve(index, name, value), where=where)
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

    def _resolve(self, index: int, name: str, value: str | Path) -> Path:
        path = Path(value).expanduser()
        if path.is_absolute():
            candidates = [path]
        else:
            roots = [r for r in (self.image_root, self.base_dir, self.base_dir / "images" if self.base_dir else None) if r]
            candidates = [root / path for root in roots] or [path]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        for candidate in candidates:  # there, but not a file: say what it is (a FIFO would block the decoder)
            kind = special_kind(candidate)
            if kind:
                raise self.fail(index, name, f"names {candidate}, which is {kind}, not an image file")
        raise self.fail(index, name, f"names an image file that does not exist: {', '.join(map(str, candidates))}")

    def _dataset_file(self, index: int, name: str, value: str | Path) -> Path:
        """A hub dataset row's image path, as a file of that dataset (or of image_root) and nothing else."""
        inside = path_in_dataset(str(value), self.hub_id)
        if inside is None:
            root = f" or of image_root {self.image_root}" if self.image_root else ""
            raise self.fail(index, name, f"names {str(value)!r}, outside the hub dataset {self.hub_id}: a hub "
                            f"dataset's image paths must be files of that dataset{root}")
        inner, revision = inside
        if self.image_root is not None:  # the user's local copy of the dataset's images
            root = self.image_root.resolve()
            candidate = (root / inner).resolve()  # symlinks followed: the file itself must be inside
            if candidate.is_relative_to(root) and candidate.is_file():
                return candidate
            if candidate.is_relative_to(root) and special_kind(candidate):
                raise self.fail(index, name, f"names {candidate}, which is {special_kind(candidate)}, not an image file")
            raise self.fail(index, name, f"names an image file that does not exist inside image_root: {root / inner}")
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(self.hub_id, inner, repo_type="dataset", revision=revision))
        except Exception as err:  # noqa: BLE001 - offline, missing, refused: the row is unusable either way
            reason = (str(err).strip().splitlines() or [""])[0]
            raise self.fail(index, name, f"names {inner}, which cannot be read from the hub dataset {self.hub_id}: "
                            f"{type(err).__name__}: {reason}") from None


def path_in_dataset(value: str, hub_id: str) -> tuple[str, str | None] | None:
    """(the path inside dataset `hub_id`, its revision) for a relative path or an `hf://datasets/<hub_id>[@rev]/...`
    address; None for anything that could leave the dataset (absolute, `~`, `..`, another scheme or repo)."""
    revision = None
    if value.startswith("hf://"):
        prefix = f"hf://datasets/{hub_id}"
        rest = value[len(prefix):] if value.lower().startswith(prefix.lower()) else None
        if rest is None or not rest.startswith(("/", "@")):
            return None
        if rest.startswith("@"):
            revision, _, rest = rest[1:].partition("/")
            if not revision:
                return None
        value = rest.lstrip("/")
    elif "://" in value or value.startswith("~"):
        return None
    posix, windows = PurePosixPath(value), PureWindowsPath(value)
    if posix.is_absolute() or windows.anchor or ".." in posix.parts or ".." in windows.parts:
        return None
    inner = "/".join(part for part in posix.parts if part != ".")
    return (inner, revision) if inner else None


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
    dataset_config: str | None = None,
    rows: Any = None,
) -> list[dict[str, Any]]:
    """Read the rows (recipes/readers.py) and run `check(checker, index, row)` on each; raises if there are none.

    on_bad_sample="skip": a bad row is left out instead of stopping the run; how many and which is logged.
    """
    if on_bad_sample not in ("error", "skip"):
        raise ValueError(f"on_bad_sample must be error or skip, not {on_bad_sample!r}")
    rows, source, base_dir = read_rows(path, hub_id, split, size, dataset_config=dataset_config, rows=rows)
    checker = RowChecker(source, base_dir, Path(image_root).expanduser() if image_root else None, hub_id=hub_id)
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
