"""The trainer a maintainer can read: one GRPOTrainer (the Python API's and the CLI's), at most one base class of
ours, built of parts that reach each other only through public names."""

from __future__ import annotations

import ast
from pathlib import Path

import vlm_grpo
from vlm_grpo.api.trainers import GRPOTrainer, SFTTrainer

ROOT = Path(vlm_grpo.__file__).resolve().parent
COMPOSED = [*sorted((ROOT / "grpo" / "parts").glob("*.py")), *sorted((ROOT / "grpo" / "loop").glob("*.py")),
            ROOT / "api" / "trl_trainer.py", ROOT / "api" / "trainers.py"]


def ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "vlm_grpo"


def test_one_grpo_trainer_with_at_most_one_base_class_of_ours():
    for trainer in (GRPOTrainer, SFTTrainer):
        assert len([c for c in trainer.__mro__[1:] if ours(c)]) <= 1, trainer.__mro__
    named = [p for p in ROOT.rglob("*.py") if "class GRPOTrainer" in p.read_text()]
    assert named == [ROOT / "api" / "trainers.py"]
    import vlm_grpo.commands.train as cli_train

    assert "GRPOTrainer.from_settings" in Path(cli_train.__file__).read_text()  # the CLI builds the same class
    assert vlm_grpo.GRPOTrainer is GRPOTrainer


def private_reaches(source: str) -> list[str]:
    """`self.part._name` and `module._name` (an imported module's private name) in `source`."""
    tree = ast.parse(source)
    modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
                if a.name.islower()}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        through_a_part = isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self"
        a_module = isinstance(owner, ast.Name) and owner.id in modules
        if through_a_part or a_module:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_part_reaches_into_another_parts_private_names():
    found = {str(p.relative_to(ROOT)): private_reaches(p.read_text()) for p in COMPOSED}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_private_reach_check_sees_one():
    assert private_reaches("import x\nclass A:\n    def f(self):\n        return self.policy._model, x._y\n") == [
        "4: self.policy._model", "4: x._y"]
