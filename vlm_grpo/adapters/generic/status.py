"""What the generic adapter was measured to do for each model type (`model_types.json`, beside this file).

Written by `vlm-grpo families --all --measure` (twin, calibration, cache probe, 2 GRPO steps, and the contract suite
where the repository's tests are at hand) for the transformers version it names, with that version's whole
image-text-to-text mapping (type -> class); read by `vlm-grpo families --all` and the table of docs/families.md,
which therefore describe the measured (locked) transformers whatever is installed. The test suite runs the contract suite and the cache probe on every type recorded as `generic`,
so a record that stops being true fails a test.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

STATUS_FILE = Path(__file__).with_name("model_types.json")
GENERIC, UNSUPPORTED = "generic", "not supported"


@dataclass(frozen=True)
class TypeRecord:
    status: str  # GENERIC or UNSUPPORTED
    reason: str = ""  # why not (UNSUPPORTED): the one-line refusal, without the model type
    shares_features: bool = False  # GENERIC: image features encoded once per prompt (calibrated)
    shares_prefix: bool = False  # GENERIC: prompt prefilled once, its KV cache expanded G times (calibrated)
    cache: str = ""  # GENERIC: what the cache probe decided (`cache` / `no cache`)
    steps: dict = field(default_factory=dict)  # GENERIC: recipe -> GRPO steps run
    extra: str = ""  # the vlm-grpo extra whose package the twin's model is built from (timm towers), if any


@lru_cache(maxsize=None)
def recorded() -> tuple[str, dict[str, TypeRecord]]:
    """(transformers version measured, model type -> record)."""
    if not STATUS_FILE.is_file():
        return "", {}
    data = json.loads(STATUS_FILE.read_text())
    return data["transformers"], {t: TypeRecord(**r) for t, r in data["types"].items()}


@lru_cache(maxsize=None)
def recorded_mapping() -> dict[str, str]:
    """The image-text-to-text mapping (model type -> class name) of the transformers version measured."""
    if not STATUS_FILE.is_file():
        return {}
    return dict(json.loads(STATUS_FILE.read_text()).get("mapping", {}))


def generic_types() -> list[str]:
    """Model types recorded as served and passing by the generic adapter, less those the installed transformers
    itself breaks (upstream_breaks.py)."""
    import transformers

    from vlm_grpo.adapters.generic.upstream_breaks import upstream_break

    return sorted(t for t, r in recorded()[1].items()
                  if r.status == GENERIC and upstream_break(t, transformers.__version__) is None)


def write(version: str, records: dict[str, TypeRecord], mapping: dict[str, str]) -> None:
    body = {"transformers": version, "mapping": dict(sorted(mapping.items())),
            "types": {t: asdict(records[t]) for t in sorted(records)}}
    STATUS_FILE.write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")
    recorded.cache_clear()
    recorded_mapping.cache_clear()
