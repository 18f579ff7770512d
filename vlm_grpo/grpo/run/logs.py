"""The run directory's logs: metrics.jsonl (one line per step) and completions.jsonl (one per completion; the same rows
per step as parquet under completions/, grpo/run/completion_files.py) and errors.log (user code's tracebacks),
appended and rewritten only through grpo/safe_files.py (never through a link, recorded as the run's own files)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.completion_files import remove_after
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.user_calls import ERROR_LOG, failure_entry

METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"
log = logging.getLogger(__name__)


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.enabled = enabled

    def truncate_after(self, step: int) -> int:
        """Drop lines logged after `step` (a resumed run redoes those steps; -1 drops them all) and lines a kill cut
        short; returns how many training steps were dropped from metrics.jsonl."""
        if not self.enabled:
            return 0
        dropped = 0
        for name in (METRICS, COMPLETIONS):
            path = self.run_dir / name
            if path.exists():
                text = path.read_text(errors="replace")
                lines = text.splitlines()
                kept = []
                for number, line in enumerate(lines, 1):
                    row = _parse(line)
                    if row is None and line.strip():
                        warn_damaged(path, number, line)
                    if row is not None and row.get("step", 0) <= step:
                        kept.append(line)
                    elif name == METRICS and row is not None and row.get("step", 0) > 0 and "stage" not in row:
                        dropped += 1
                # rewritten only when a line goes or the last one lacks its newline (completions.jsonl can be large)
                if len(kept) < len(lines) or not text.endswith("\n"):
                    safe_files.write_run_file(self.run_dir, name, "".join(line + "\n" for line in kept))
        remove_after(self.run_dir, step)  # the per-step parquet files of the steps redone
        return dropped

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not self.enabled or not rows:
            return
        safe_files.append_run_file(self.run_dir, name, "".join(json.dumps(row, default=float) + "\n" for row in rows))

    def metrics(self, row: dict[str, Any]) -> None:
        self._append(METRICS, [row])

    def completions(self, rows: list[dict[str, Any]]) -> None:
        self._append(COMPLETIONS, rows)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A run log's rows; a damaged line (a write cut short by a kill or a full disk, bytes that are not UTF-8) is
    skipped with a warning naming the file and the line, so report, plot and completions read the rest."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        row = _parse(line)
        if row is None:
            warn_damaged(path, number, line)
            continue
        rows.append(row)
    return rows


def warn_damaged(path: Path, number: int, line: str) -> None:
    log.warning("%s: line %d is damaged (not one JSON object: %r), skipped; a write cut short by a kill or a full "
                "disk leaves such a line", path, number, line[:60])


def log_failure(run_dir: Path | None, err: BaseException) -> None:
    """Append err's full traceback (a user function's own) to the run's errors.log, a run file like any other (no
    links, on the run's list); the one-line message goes out whatever happens here."""
    if run_dir is None or not Path(run_dir).is_dir():
        return
    try:
        safe_files.append_run_file(Path(run_dir), ERROR_LOG, failure_entry(err))
    except (OSError, SettingError):
        pass
