"""Settings text and user modules that are broken: one line naming the file, line and column (or the setting),
exit 2 for a refused setting, 1 for a reward module that fails; duplicate keys and unsafe tags are refused."""

from __future__ import annotations

import pytest

from vlm_grpo.cli import main
from vlm_grpo.grpo.training import policy


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    monkeypatch.setattr(policy, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("text, where, problem", [
    ("max_steps: 3\nloss:\n  beta: 0.1\n   epsilon: 0.2\n", "4:11", "mapping values are not allowed here"),
    ("data:\n  recipe_options: {path: data\n", "3:1", "expected ',' or '}', but got '<stream end>'"),
    ("max_steps: [1,\n", "2:1", "expected the node content, but found '<stream end>'"),
    ("max_steps: 3\nseed: 1\nmax_steps: 5\n", "3:1", "duplicate key 'max_steps' (first set on line 1)"),
    ("loss:\n  beta: 0.1\n  beta: 0.2\n", "3:3", "duplicate key 'beta' (first set on line 2)"),
    ("max_steps: !!python/object/apply:os.system ['touch PWNED']\n", "1:12",
     "tag '!!python/object/apply:os.system' is not allowed: settings are plain YAML (no tags that build objects or "
     "run code)"),
], ids=["indent", "open-brace", "open-list", "duplicate", "duplicate-in-section", "unsafe-tag"])
def test_a_broken_settings_file_is_one_line_with_file_line_and_column(text, where, problem, tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert main(["train", "--config", str(path)]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"vlm-grpo train: error: setting 'config': {path}:{where}: {problem}"), err
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("words, message", [
    (["--data.recipe_options", "{path:"], "setting 'data.recipe_options': '{path:' is not valid YAML: line 1, column 7: "
                                          "expected the node content, but found '<stream end>' (while parsing a flow node)"),
    (["--reward-weights", "[1,"], "setting 'data.reward_weights': '[1,' is not valid YAML: line 1, column 4: expected "
                                  "the node content, but found '<stream end>' (while parsing a flow node)"),
    (["--data.recipe_options", "{a: 1, a: 2}"], "setting 'data.recipe_options': '{a: 1, a: 2}' is not valid YAML: "
                                                "line 1, column 8: duplicate key 'a' (first set on line 1)"),
])
def test_a_broken_inline_value_names_the_setting_and_column(words, message, capsys):
    assert main(["train", *words]) == 2
    assert _one_line(capsys) == f"vlm-grpo train: error: {message}"


def test_a_settings_file_that_is_not_utf8_is_named(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"max_steps: 3\nrun_name: caf\xe9\n")
    assert main(["train", "--config", str(path)]) == 2
    assert _one_line(capsys) == (f"vlm-grpo train: error: setting 'config': {path} is not UTF-8 text (byte 0xe9 at "
                                 "offset 26)")


@pytest.mark.parametrize("source, message", [
    ("def fn(completions, **kw):\n    return [1.0 for c in completions\n", "{path}:2:12: SyntaxError: '[' was never closed"),
    ("import math\nSCALE = 1 / 0\n", "importing {path} raised ZeroDivisionError: division by zero (at {path}:2)"),
    ("import sys\nsys.exit(2)\n", "importing {path} called sys.exit(2) (at {path}:2)"),
    ("import no_such_package_here\n", "importing {path} raised ModuleNotFoundError: No module named "
                                      "'no_such_package_here' (at {path}:1)"),
], ids=["syntax", "raises", "exits", "missing-import"])
def test_a_reward_module_that_fails_to_import_is_one_line_naming_where(source, message, tmp_path, capsys):
    path = tmp_path / "my_rewards.py"
    path.write_text(source)
    code = main(["train", "--model", "tiny:qwen2_5_vl", "--reward", f"{path}:fn", "--output-dir", str(tmp_path / "run")])
    assert code == 1
    assert _one_line(capsys) == (f"vlm-grpo train: error: reward function '{path}:fn': "
                                 f"{message.format(path=path)}")
