"""A table over the classes of input that once went wrong in silence: settings given twice (files, spellings, an
experiment's keys and --set), YAML that expands past its bound, links planted where an experiment writes, and
arguments of the wrong kind. Each case runs the command in-process and must end in its one expected line with its exit
code, write nothing, and leave every file it was given unchanged; nothing may load a model."""

from __future__ import annotations

import hashlib
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.reliability.conftest import TOY_EXPERIMENT, nested_aliases
from tests.reliability.test_bad_settings import no_model_loads  # noqa: F401 - autouse: nothing may load a model
from vlm_grpo.cli import main



@dataclass
class Case:
    name: str
    files: dict[str, str]  # name -> text, written into the case's folder
    argv: Callable[[Path], list[str]]  # the command, given the case's folder
    line: str  # what the error line holds
    code: int = 2
    links: tuple[tuple[str, str], ...] = ()  # (link, target): made before the command


def _experiment(grpo: str = "", extra: str = "") -> str:
    return textwrap.dedent(TOY_EXPERIMENT).format(out="{out}", grpo=grpo, extra=extra)




def train(*names: str, extra: tuple[str, ...] = ()) -> Callable[[Path], list[str]]:
    def argv(folder: Path) -> list[str]:
        words = ["train"]
        for name in names:
            words += ["--config", str(folder / name)]
        return [*words, "--output-dir", str(folder / "run"), *extra]

    return argv


def cli(*words: str) -> Callable[[Path], list[str]]:
    """A command whose words may name the case's folder as {d}."""
    return lambda folder: [w.replace("{d}", str(folder)) for w in words]


RUN_FOLDER = {"runs/x/checkpoint-4/trainer_state.json": "{}", "runs/x/final/config.json": "{}", "afile": "mine"}


def experiment(*extra: str, stages: str = "compose") -> Callable[[Path], list[str]]:
    return lambda folder: ["experiment", str(folder / "exp.yaml"), "--stages", stages, *extra]


SPELLINGS = [  # two ways of writing one setting in one file: (first, second, the setting)
    ("max_completion_length: 12", "generation: {max_new_tokens: 20}", "generation.max_new_tokens"),
    ("save_steps: 5", "logging: {save_every: 7}", "logging.save_every"),
    ("save_total_limit: 1", "logging: {keep_checkpoints: 3}", "logging.keep_checkpoints"),
    ("num_train_epochs: 2", "epochs: 3", "epochs"),
    ("max-steps: 4", "max_steps: 6", "max_steps"),
    ("beta: 0.1", "loss: {beta: 0.2}", "loss.beta"),
    ("epsilon: 0.1", "loss: {epsilon: 0.3}", "loss.epsilon"),
    ("use_vllm: true", "rollout: {engine: transformers}", "rollout.engine"),
    ("mixed_precision: fp16", "fp16: false", "mixed_precision"),
    ("bf16: true", "fp16: true", "mixed_precision"),
    ("learning_rate: 0.001", "optim: {learning_rate: 0.002}", "optim.learning_rate"),
    ("lr_scheduler_type: cosine", "optim: {lr_scheduler: linear}", "optim.lr_scheduler"),
    ("adam_epsilon: 1.0e-6", "optim: {adam_eps: 1.0e-8}", "optim.adam_eps"),
    ("temperature: 0.7", "generation: {temperature: 1.0}", "generation.temperature"),
    ("num_generations: 4", "data: {num_generations: 8}", "data.num_generations"),
    ("dataset_name: a/b", "data: {dataset: c/d}", "data.dataset"),
    ("shuffle_dataset: false", "data: {shuffle: true}", "data.shuffle"),
    ("gradient_checkpointing: true", "perf: {gradient_checkpointing: false}", "perf.gradient_checkpointing"),
]

CASES = [
    *(Case(f"one file, {key}", {"a.yaml": f"{a}\n{b}\n"}, train("a.yaml"), f"setting '{key}': ")
      for a, b, key in SPELLINGS),
    Case("one file, a key twice", {"a.yaml": "max_steps: 3\nseed: 1\nmax_steps: 5\n"}, train("a.yaml"),
         "duplicate key 'max_steps' (first set on line 1)"),
    Case("one file, a key twice in a section", {"a.yaml": "loss:\n  beta: 0.1\n  beta: 0.2\n"}, train("a.yaml"),
         "duplicate key 'beta' (first set on line 2)"),
    Case("one file, a section twice", {"a.yaml": "loss: {beta: 0.1}\nloss: {epsilon: 0.2}\n"}, train("a.yaml"),
         "duplicate key 'loss'"),
    Case("two files, one key", {"a.yaml": "max_steps: 3\n", "b.yaml": "max_steps: 4\n"}, train("a.yaml", "b.yaml"),
         "setting 'max_steps': set in two --config files"),
    Case("two files, two spellings", {"a.yaml": "generation: {max_new_tokens: 9}\n", "b.yaml": "max_completion_length: 8\n"},
         train("a.yaml", "b.yaml"), "setting 'generation.max_new_tokens': set in two --config files"),
    Case("three files, the last two", {"a.yaml": "seed: 1\n", "b.yaml": "loss: {beta: 0.1}\n", "c.yaml": "beta: 0.2\n"},
         train("a.yaml", "b.yaml", "c.yaml"), "setting 'loss.beta': set in two --config files"),
    Case("two files, a section and a TRL name", {"a.yaml": "optim: {lr_scheduler: linear}\n",
                                                 "b.yaml": "lr_scheduler_type: cosine\n"},
         train("a.yaml", "b.yaml"), "setting 'optim.lr_scheduler': set in two --config files"),
    *(Case(f"aliases {levels}x{width}", {"a.yaml": nested_aliases(levels, width)}, train("a.yaml"),
           "aliases expand to more than 100,000 values") for levels, width in ((9, 9), (5, 40), (20, 2), (3, 500))),
    Case("aliases in a section", {"a.yaml": "loss: {beta: 0.1}\n" + nested_aliases(12, 4)}, train("a.yaml"),
         "aliases expand to more than 100,000 values"),
    Case("experiment, a key twice", {"exp.yaml": _experiment(extra="eval: {splits: [ood], size: 2}\n")},
         experiment(), "duplicate key 'eval'", code=1),
    Case("experiment, a stage key twice", {"exp.yaml": _experiment(grpo=", max_steps: 3")}, experiment(),
         "duplicate key 'max_steps'", code=1),
    Case("experiment, --set twice", {"exp.yaml": _experiment()},
         experiment("--set", "grpo.max_steps=4", "--set", "grpo.max_steps=5"),
         "--set grpo.max_steps is given twice", code=1),
    Case("experiment, a stage's two spellings", {"exp.yaml": _experiment(grpo=", max_completion_length: 8, "
                                                                         "generation: {max_new_tokens: 16}")},
         experiment(), "grpo sets it twice, as max_completion_length: 8", code=1),
    Case("experiment, a stage's TRL flags", {"exp.yaml": _experiment(grpo=", beta: 0.1, loss: {beta: 0.2}")},
         experiment(), "grpo sets it twice, as beta: 0.1", code=1),
    Case("experiment, an arm's two spellings",
         {"exp.yaml": _experiment(extra="arms: {hot: {method: grpo, set: {temperature: 1.5, "
                                        "generation: {temperature: 0.5}}}}\n")},
         experiment(), "arms.hot.set sets it twice", code=1),
    Case("experiment, aliases", {"exp.yaml": _experiment(extra=nested_aliases(9, 9))}, experiment(),
         "aliases expand to more than 100,000 values", code=1),
    Case("experiment, a --set value that is not YAML", {"exp.yaml": _experiment()},
         experiment("--set", "grpo.loss.beta=[1,"), "--set grpo.loss.beta: '[1,' is not valid YAML", code=1),
    Case("--resume-from a run folder", RUN_FOLDER, cli("train", "--resume-from", "{d}/runs/x"),
         "runs/x/checkpoint-4 (its newest), or --resume"),
    Case("--resume-from a final model", RUN_FOLDER, cli("train", "--resume-from", "{d}/runs/x/final"),
         "is a run's final model, not a checkpoint"),
    Case("--resume-from a file", RUN_FOLDER, cli("train", "--resume-from", "{d}/afile"),
         "afile is a file, not a checkpoint folder"),
    Case("--resume-from nothing", RUN_FOLDER, cli("train", "--resume-from", "{d}/nothere"), "nothere does not exist"),
    Case("--output-dir a file", RUN_FOLDER, cli("train", "--output-dir", "{d}/afile"), "afile is a file, not a folder"),
    Case("--output-dir under a file", RUN_FOLDER, cli("train", "--output-dir", "{d}/afile/sub"),
         "(on the way to"),
    Case("eval --model a run folder", RUN_FOLDER, cli("eval", "--model", "{d}/runs/x"),
         "runs/x is a run folder, not a model: pass"),
    Case("--init-from a run folder", RUN_FOLDER, cli("train", "--init-from", "{d}/runs/x"),
         "setting 'model.init_from': "),
    Case("--model a run folder", RUN_FOLDER, cli("train", "--model", "{d}/runs/x", "--output-dir", "{d}/new"),
         "runs/x/checkpoint-4 (its newest checkpoint)"),
    Case("--config a folder", RUN_FOLDER, cli("train", "--config", "{d}/runs"), "runs is a directory, not a file"),
    Case("--config nothing", RUN_FOLDER, cli("train", "--config", "{d}/missing.yaml"), "no such file"),
    Case("a second --config that is a folder", {"a.yaml": "seed: 1\n", "d/x": ""},
         cli("train", "--config", "{d}/a.yaml", "--config", "{d}/d"), "is a directory, not a file"),
    Case("--config with an unsafe tag", {"a.yaml": "max_steps: !!python/object/apply:os.system ['touch x']\n"},
         train("a.yaml"), "is not allowed: settings are plain YAML"),
    Case("a second --config with a key twice", {"a.yaml": "seed: 1\n", "b.yaml": "beta: 0.1\nbeta: 0.2\n"},
         train("a.yaml", "b.yaml"), "duplicate key 'beta'"),
    Case("experiment file missing", {}, cli("experiment", "{d}/missing.yaml"), "does not exist", code=1),
    Case("experiment --set without =", {"exp.yaml": _experiment()}, experiment("--set", "grpo.max_steps"),
         "write KEY=VALUE", code=1),
    *(Case(f"experiment, {link} a link", {"exp.yaml": _experiment()}, experiment(stages=stage),
           "is a symlink to", code=2, links=((f"runs/{link}", "elsewhere"),))
      for link, stage in ((".locks", "compose"), ("base-seed0", "compose"), ("base-seed0/compose", "compose"),
                          ("seed0", "grpo"), ("seed0/sft", "sft"), ("seed0/sft/final", "sft"), ("seed0/eval", "eval"),
                          ("base-seed0/align", "align"))),
]


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                out[key] = "-> " + os.readlink(path)
            elif path.is_file():
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[key] = "dir"
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_ends_in_its_one_line_and_changes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text.replace("{out}", str(tmp_path / "runs")))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("mine")
    for link, target in case.links:
        (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(tmp_path / target, tmp_path / link)
    before = _tree(tmp_path)
    assert main(case.argv(tmp_path)) == case.code
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if not line.startswith("versions:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert case.line in lines[0], (case.line, lines[0])
    after = _tree(tmp_path)
    made = {k for k in after if k not in before}
    # the experiment's lock folder may be made before its link check stops it; nothing else is written
    assert {k for k in made if not k.startswith("runs")} == set() and not [k for k in made if Path(k).suffix], made
    assert {k: v for k, v in after.items() if k in before} == before


def test_the_table_is_at_least_sixty_cases():
    assert len(CASES) >= 60, len(CASES)
