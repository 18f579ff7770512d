"""The run directory's logs: metrics.jsonl (one line per step) and completions.jsonl (one per completion)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"


class RunLog:
    def __init__(self, run_dir: Path, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (a resumed run redoes those steps)."""
        if not self.enabled:
            return
        for name in (METRICS, COMPLETIONS):
            path = self.run_dir / name
            if path.exists():
                kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
                path.write_text("".join(line + "\n" for line in kept))

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        if not self.enabled or not rows:
            return
        with open(self.run_dir / name, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=float) + "\n")
            fh.flush()

    def metrics(self, row: dict[str, Any]) -> None:
        self._append(METRICS, [row])

    def completions(self, rows: list[dict[str, Any]]) -> None:
        self._append(COMPLETIONS, rows)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
