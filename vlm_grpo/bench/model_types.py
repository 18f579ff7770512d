"""Measure what the generic adapter does for each image-text-to-text model type without a family file.

Per type, in order, the first failure is its recorded reason: the tiny twin builds and calibrates (adapters/
generic), every parameter is in one module group, the cache probe gives a verdict the policy can act on, two GRPO
steps run on the `shapes` recipe, and (when the repository's tests are at hand) the adapter contract suite passes.
The records go to adapters/generic/model_types.json, which `vlm-grpo families --all` and the table of docs/families.md read.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import transformers

from vlm_grpo.adapters.generic.status import GENERIC, UNSUPPORTED, TypeRecord, recorded, write
from vlm_grpo.adapters.generic.support import image_text_types, model_extra
from vlm_grpo.adapters.registry import adapter_class, is_generic_type

CONTRACT = Path("tests") / "adapters" / "test_contract.py"


MISMATCH = re.compile(r"the prompt holds (\d+) image tokens but its images give (\d+) image features")
LONGEST = 160  # a table cell


def short_reason(model_type: str, text: str) -> str:
    """A refusal as a table cell: without the model type, the token/feature counts of a mismatch, one line."""
    text = (text.strip().splitlines() or [""])[0]
    text = text[len(model_type) + 2:] if text.startswith(f"{model_type}: ") else text
    match = MISMATCH.search(text)
    if match:
        text = text[: text.index("(")].strip() + f" ({match.group(1)} tokens vs {match.group(2)} features for a probe image)"
    return text if len(text) <= LONGEST else text[: LONGEST - 3].rstrip() + "..."


def _reason(model_type: str, stage: str, err: BaseException) -> str:
    text = short_reason(model_type, str(err) or type(err).__name__)
    return f"{stage}: {text}" if stage else text


def _grpo_steps(model_type: str, recipe: str, out: str) -> int:
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.api.trainers import GRPOTrainer

    cfg = load_config(overrides=[
        "--model", f"tiny:{model_type}", "--recipe", recipe, "--max-steps", "2", "--output-dir", out,
        "--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2", "--data.train-size", "2",
        "--logging.progress", "false", "--data.recipe_options", "{image_size: 56}",
    ])
    trainer = GRPOTrainer.from_settings(cfg)
    trainer.train()
    return len(trainer.history)


def _contract(model_type: str) -> str | None:
    """The first failing contract test of `model_type` (None: all pass, or no tests to run here)."""
    if not CONTRACT.is_file():
        return None
    env = {**os.environ, "VLM_GRPO_CONTRACT_TYPES": model_type, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-W", "ignore",
                          str(CONTRACT)], capture_output=True, text=True, env=env)
    if run.returncode == 0:
        return None
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    return failed[0].split("::")[-1].split(" ")[0] if failed else f"pytest exit {run.returncode}"


def measure_type(model_type: str, contract: bool = True) -> TypeRecord:
    from vlm_grpo.compat.cache_probe import probe_cache

    try:
        adapter = adapter_class(model_type).tiny(seed=0)
        adapter.check_module_groups()
    except Exception as err:  # the refusal names what is missing
        return TypeRecord(UNSUPPORTED, _reason(model_type, "", err))
    try:
        report = probe_cache(adapter, steps=4)
    except Exception as err:
        return TypeRecord(UNSUPPORTED, _reason(model_type, "cache probe", err))
    if report.blind or not report.path_ok(report.cache_ok):
        return TypeRecord(UNSUPPORTED, "cache probe: " + ("blind (the image does not change the logits)"
                                                           if report.blind else "generation disagrees with the forward"))
    steps = {}
    with tempfile.TemporaryDirectory() as out:
        try:
            steps["shapes"] = _grpo_steps(model_type, "shapes", out)
        except Exception as err:
            return TypeRecord(UNSUPPORTED, _reason(model_type, "2 GRPO steps", err))
    failed = _contract(model_type) if contract else None
    if failed:
        return TypeRecord(UNSUPPORTED, f"contract suite: {failed} fails")
    return TypeRecord(GENERIC, shares_features=adapter.shares_features, shares_prefix=adapter.shares_prefix,
                      cache="cache" if report.cache_ok else "no cache", steps=steps, extra=model_extra(adapter.model))


def measure(types: list[str] | None = None, contract: bool = True, log=print) -> dict[str, TypeRecord]:
    """Measure `types` (default: every type without a family file) and merge them into the recorded table."""
    todo = types or [t for t in image_text_types() if is_generic_type(t)]
    _, records = recorded()
    records = {t: r for t, r in records.items() if is_generic_type(t)}
    for model_type in todo:
        records[model_type] = measure_type(model_type, contract=contract)
        record = records[model_type]
        log(f"{model_type}: {record.status}" + (f" ({record.reason})" if record.reason else ""))
        write(transformers.__version__, records, image_text_types())  # after each type: a long run interrupted keeps what it measured
    return records
