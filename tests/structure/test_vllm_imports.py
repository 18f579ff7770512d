"""`make test` neither installs nor imports vLLM: the package names it in its vLLM rollout folder only, and only inside
functions, which run when rollout.engine vllm (or `vlm-grpo bench --engine vllm`) is chosen."""

from __future__ import annotations

import ast
from pathlib import Path

import vlm_grpo

ROOT = Path(vlm_grpo.__file__).resolve().parent
ALLOWED_FOLDER = "grpo/rollout/vllm/"  # vLLM rollouts: runtime, engine, server, the worker extension


def vllm_imports(source: str) -> list[tuple[int, bool]]:
    """(line, at module level) of every `import vllm...` / `from vllm... import` in `source`."""
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        if any(n == "vllm" or n.startswith("vllm.") for n in names):
            found.append((node.lineno, id(node) in top))
    return found


def test_vllm_is_imported_inside_functions_of_the_rollout_modules_only():
    where = {str(p.relative_to(ROOT)): vllm_imports(p.read_text()) for p in ROOT.rglob("*.py")}
    where = {k: v for k, v in where.items() if v}
    assert all(k.startswith(ALLOWED_FOLDER) for k in where), where
    assert where  # the check sees the imports it guards
    assert not [(k, line) for k, found in where.items() for line, top in found if top]


def test_the_check_sees_a_module_level_import():
    assert vllm_imports("import vllm\ndef f():\n    from vllm import LLM\n") == [(1, True), (3, False)]
    assert vllm_imports("try:\n    import vllm.x\nexcept ImportError:\n    pass\n") == [(2, True)]
    assert vllm_imports("import vllm_ext\nfrom vlm_grpo import x\n") == []
