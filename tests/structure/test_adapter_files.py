"""Where a family's code lives: its runtime adapter in adapters/families/<name>.py, its tiny twin and presets in
adapters/twins/<name>.py (mixed into the adapter); and VLMAdapter = the contract + the machinery every family shares,
each name defined in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vlm_grpo
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.contract import AdapterContract
from vlm_grpo.adapters.registry import families

ADAPTERS = Path(vlm_grpo.__file__).resolve().parent / "adapters"
TWIN_NAMES = ("build", "tiny_architecture", "presets")


@pytest.mark.parametrize("path", sorted((ADAPTERS / "families").glob("[!_]*.py")), ids=lambda p: p.stem)
def test_a_family_file_holds_no_twin_and_has_a_twin_file_of_its_name(path):
    assigned = {target.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                for item in node.body for target in getattr(item, "targets", [getattr(item, "target", None)])
                if isinstance(target, ast.Name)}
    defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not (assigned | defined) & set(TWIN_NAMES), path.name
    assert (ADAPTERS / "twins" / path.name).is_file(), f"no twins/{path.name}"


@pytest.mark.parametrize("family", sorted(families()))
def test_a_family_gets_its_twin_from_the_twins_package(family):
    cls = families()[family]
    for name in TWIN_NAMES:
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if name == "presets" and owner is AdapterContract:  # a family without presets: the contract's empty default
            continue
        assert owner.__module__.startswith("vlm_grpo.adapters.twins."), (family, name, owner)


def test_vlm_adapter_is_the_contract_plus_machinery_each_name_defined_once():
    machinery = [base for base in VLMAdapter.__bases__ if base is not AdapterContract]
    assert AdapterContract in VLMAdapter.__bases__ and machinery
    contract = {n for k in AdapterContract.__mro__ if k.__module__.startswith("vlm_grpo") for n in vars(k)}
    seen: dict[str, str] = {}
    for part in machinery:
        for name in vars(part):
            if name.startswith("__") and name != "__init__":
                continue
            assert name not in contract, f"{part.__name__}.{name} shadows the contract's"
            assert name not in seen, f"{name} in both {seen[name]} and {part.__name__}"
            seen[name] = part.__name__
    assert {"load", "tiny", "preset", "encode_prompts", "generate", "module_groups"} <= set(seen)
    assert getattr(AdapterContract.build, "__isabstractmethod__", False)
