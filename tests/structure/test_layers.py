"""The package's floors: each module imports only its own floor or the floors below, and no import circles,
counting imports inside functions and modules loaded by name (importlib)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vlm_grpo

ROOT = Path(vlm_grpo.__file__).resolve().parent
# Bottom to top. A module's floor is that of the longest matching prefix.
FLOORS = [
    ("vlm_grpo", "vlm_grpo.images", "vlm_grpo.pretrained"),  # shared utilities and shipped data
    ("vlm_grpo.adapters", "vlm_grpo.recipes"),  # the model side's ground floor; tasks
    ("vlm_grpo.compat",),  # version quirks and their probes (use adapters)
    ("vlm_grpo.loader", "vlm_grpo.compose", "vlm_grpo.gguf"),  # the one loader (decides the cache policy); hybrids from donors; GGUF LMs
    ("vlm_grpo.grpo",),  # the shared loop (and SFT, evaluation)
    ("vlm_grpo.inspect", "vlm_grpo.bench", "vlm_grpo.api",
     "vlm_grpo.experiment"),  # reading runs and models; the benchmark; the Python API; multi-stage experiments
    ("vlm_grpo.commands",),  # every CLI command
    ("vlm_grpo.cli",),
]
FACADE = "vlm_grpo"  # the package itself: its names are the Python API's, loaded on first use (the top floor)
# Inside a package, its own floors (bottom to top): a module's imports inside the package stay on its floor or below.
INNER_FLOORS = {
    "vlm_grpo.adapters": [
        ("vlm_grpo.adapters.architecture", "vlm_grpo.adapters.batch", "vlm_grpo.adapters.features",
         "vlm_grpo.adapters.image_layout", "vlm_grpo.adapters.module_groups", "vlm_grpo.adapters.quantization",
         "vlm_grpo.adapters.seeding", "vlm_grpo.adapters.chat_templates", "vlm_grpo.adapters.tiny_tokenizer",
         "vlm_grpo.adapters.model_dirs", "vlm_grpo.adapters.teacher_forcing",
         "vlm_grpo.adapters.visual_spans", "vlm_grpo.adapters.completion_images",
         "vlm_grpo.adapters.quirks", "vlm_grpo.adapters.sampler", "vlm_grpo.adapters.cache_names",
         "vlm_grpo.adapters.freeze", "vlm_grpo.adapters.prompt_cache"),  # parts of the contract
        ("vlm_grpo.adapters.video_hooks", "vlm_grpo.adapters.image_routes"),  # the contract's video side, image routes
        ("vlm_grpo.adapters.contract", "vlm_grpo.adapters.construction", "vlm_grpo.adapters.prompt_encoding",
         "vlm_grpo.adapters.model_calls", "vlm_grpo.adapters.parameter_groups", "vlm_grpo.adapters.base",
         "vlm_grpo.adapters.sharing", "vlm_grpo.adapters.image_attention",
         "vlm_grpo.adapters.assembly"),  # the contract and the machinery VLMAdapter adds to it, the sharing engine,
        # attention to the image, what every hybrid pairing shares
        ("vlm_grpo.adapters.generic",),  # the adapter of any model type without a family file
        ("vlm_grpo.adapters.twins",),  # each family's tiny twin and presets, mixed into its adapter
        ("vlm_grpo.adapters.families",),  # one file per family
        ("vlm_grpo.adapters.registry", "vlm_grpo.adapters.model_spec", "vlm_grpo.adapters.families_table",
         "vlm_grpo.adapters"),
    ],
    "vlm_grpo.grpo": [
        ("vlm_grpo.grpo.setting_fields", "vlm_grpo.grpo.yaml_text", "vlm_grpo.grpo.user_code",
         "vlm_grpo.grpo.async_loop", "vlm_grpo.grpo.user_calls", "vlm_grpo.grpo.call_contract",
         "vlm_grpo.grpo.safe_loading", "vlm_grpo.grpo.safe_files", "vlm_grpo.grpo.eval_stats",
         "vlm_grpo.grpo.interrupts"),  # how a setting is declared; user modules; checkpoint state read as data; how
        # every run file is written; what interrupts a run (signals, user code that exits); an evaluation's statistics
        ("vlm_grpo.grpo.algorithm", "vlm_grpo.grpo.logprobs", "vlm_grpo.grpo.rollout", "vlm_grpo.grpo.rewards",
         "vlm_grpo.grpo.distributed", "vlm_grpo.grpo.data",
         "vlm_grpo.grpo.tools", "vlm_grpo.grpo.checkpoint"),  # the algorithm, its inputs (tools: what a multi-turn
        # rollout calls); the checkpoint format, its resume rules and run state
        ("vlm_grpo.grpo.settings",),  # the run's sections, and how files and flags become them
        ("vlm_grpo.grpo.run", "vlm_grpo.grpo.heldout_eval", "vlm_grpo.grpo.training",
         "vlm_grpo.grpo.guards"),  # the run dir; a stage's parts; what watches each step
        ("vlm_grpo.grpo.sft",),  # SFT's batches and loss
        ("vlm_grpo.grpo.parts",),  # the parts a stage is built of
        ("vlm_grpo.grpo.loop", "vlm_grpo.grpo"),  # the loop and its one builder (loop/stage.py composes the parts)
    ],
}
# Imports by a computed name: where they go. Anything else computed is an error (the drawing must see it).
DYNAMIC = {"vlm_grpo.adapters.registry": "vlm_grpo.adapters.families",
           "vlm_grpo.grpo.algorithm.losses": "vlm_grpo.grpo.algorithm.losses",
           "vlm_grpo.grpo.algorithm.advantages": "vlm_grpo.grpo.algorithm.advantages"}
USER_CODE = {"vlm_grpo.grpo.user_code"}  # loads the reward or recipe module a user names: not package code


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def floor(module: str, floors=FLOORS) -> int:
    if module == FACADE and floors is FLOORS:
        return len(FLOORS)
    best = (-1, -1)
    for level, prefixes in enumerate(floors):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), level))
    assert best[1] >= 0, f"{module} is on no floor: add it to FLOORS"
    return best[1]


def _target(name: str) -> str | None:
    """The package module an import of `name` runs (the deepest existing module of the dotted name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant):
                found.add(arg.value)
            elif module in DYNAMIC:
                found.update(m for m in MODULES if m.startswith(DYNAMIC[module] + "."))
            else:
                assert module in USER_CODE, f"{module} imports a computed module name: declare it in DYNAMIC"
    targets = {_target(n) for n in found if n == "vlm_grpo" or n.startswith("vlm_grpo.")}
    return {t for t in targets if t and t != module}


GRAPH = {m: imports_of(m) for m in MODULES}


def test_no_import_runs_up_a_floor():
    upward = [f"{m} ({floor(m)}) -> {t} ({floor(t)})" for m, ts in GRAPH.items() for t in ts if floor(t) > floor(m)]
    assert upward == []


@pytest.mark.parametrize("package", sorted(INNER_FLOORS))
def test_no_import_runs_up_a_floor_inside_a_package(package):
    floors = INNER_FLOORS[package]
    inside = [m for m in MODULES if m.startswith(package + ".")]
    upward = [f"{m} -> {t}" for m in inside for t in GRAPH[m]
              if t.startswith(package + ".") and floor(t, floors) > floor(m, floors)]
    assert upward == []


def test_no_import_circles():
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert circles == []


def _one_way_breaks(package: str) -> list[str]:
    """Imports between the direct children (sub-folders and modules) of `package` that close a circle: A's
    modules import B's and B's (directly or through others) import A's."""
    def child(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return package + "." + module[len(package) + 1:].split(".")[0]

    edges: dict[str, dict[str, str]] = {}  # child -> child it imports -> one import that does it
    for m, targets in GRAPH.items():
        a = child(m)
        for t in targets:
            b = child(t)
            if a and b and a != b:
                edges.setdefault(a, {}).setdefault(b, f"{m} -> {t}")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, {}))
        return False

    return [f"{how} (and {b} leads back to {a})" for a, out in edges.items() for b, how in out.items()
            if reaches(b, a)]


PACKAGES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_between_the_parts_of_a_folder_go_one_way(package):
    assert _one_way_breaks(package) == []


def test_the_one_way_check_sees_a_circle_between_folders(monkeypatch):
    """The check itself: one import from grpo/algorithm back to grpo/settings (which imports it) is a circle."""
    monkeypatch.setitem(GRAPH, "vlm_grpo.grpo.algorithm.trajectory",
                        GRAPH["vlm_grpo.grpo.algorithm.trajectory"] | {"vlm_grpo.grpo.settings.sections"})
    assert any("vlm_grpo.grpo.algorithm.trajectory -> vlm_grpo.grpo.settings.sections" in line
               for line in _one_way_breaks("vlm_grpo.grpo"))


def test_the_drawing_sees_the_family_discovery():
    families = {m for m in MODULES if m.startswith("vlm_grpo.adapters.families.")}
    assert families and families <= GRAPH["vlm_grpo.adapters.registry"]


def test_the_loop_recipes_and_inspect_know_no_family():
    words = ("qwen", "internvl", "idefics", "smolvlm", "gemma", "llava", "glm", "lfm2", "mistral", "pixtral",
             "mrope", "rope_deltas", "pixel_attention_mask", "image_grid_thw")
    hits = []
    for m, path in MODULES.items():
        if m.startswith(("vlm_grpo.grpo", "vlm_grpo.recipes", "vlm_grpo.inspect")):
            for k, line in enumerate(path.read_text().lower().splitlines(), 1):
                hits += [f"{m}:{k}: {w}" for w in words if w in line]
    assert hits == []
