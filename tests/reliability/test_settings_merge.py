"""One merge of settings: a setting given twice within one file (two spellings, a key repeated), an experiment (a key
or `--set` repeated) or in two `--config` files is refused naming both places; on the command line a later flag
replaces an earlier one and says so; across sources the stated order holds (defaults < files < command line). Nested YAML aliases that would expand past a bound are
refused before anything is built."""

from __future__ import annotations

import textwrap

import pytest

from tests.reliability.conftest import TOY_EXPERIMENT, nested_aliases
from vlm_grpo.cli import main
from vlm_grpo.experiment.plan import ExperimentError, read_experiment
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config, load_recipe_config
from vlm_grpo.grpo.training import policy


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    monkeypatch.setattr(policy, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


def _yaml(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# (first spelling, second spelling, canonical key): two ways of writing one setting
SPELLINGS = [
    ("max_completion_length: 12", "generation: {max_new_tokens: 20}", "generation.max_new_tokens"),
    ("save_steps: 5", "logging: {save_every: 7}", "logging.save_every"),
    ("num_train_epochs: 2", "epochs: 3", "epochs"),
    ("max-steps: 4", "max_steps: 6", "max_steps"),
    ("beta: 0.1", "loss: {beta: 0.2}", "loss.beta"),
    ("use_vllm: true", "rollout: {engine: transformers}", "rollout.engine"),
    ("mixed_precision: fp16", "fp16: false", "mixed_precision"),
    ("learning_rate: 0.001", "optim: {learning_rate: 0.002}", "optim.learning_rate"),
    ("temperature: 0.7", "generation: {temperature: 1.0}", "generation.temperature"),
]


@pytest.mark.parametrize("first, second, key", SPELLINGS, ids=[s[2] for s in SPELLINGS])
def test_one_file_writing_a_setting_twice_is_refused_naming_both_spellings(first, second, key, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _yaml(tmp_path, "run.yaml", f"{first}\n{second}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"setting '{key}'" in err and f"{path} sets it twice" in err, err
    assert first.split(":")[0].strip() in err  # both spellings named
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run folder, nothing written


def test_two_spellings_with_one_meaning_are_accepted_and_a_negating_flag_undoes_nothing(tmp_path):
    same = load_config(_yaml(tmp_path, "a.yaml", "max_completion_length: 12\ngeneration: {max_new_tokens: 12}\n"))
    assert same.generation.max_new_tokens == 12
    for text in ("bf16: true\nfp16: false\n", "fp16: false\nbf16: true\n"):
        assert load_config(_yaml(tmp_path, "b.yaml", text)).mixed_precision == "bf16", text
    assert load_config(_yaml(tmp_path, "c.yaml", "bf16: false\nfp16: true\n")).mixed_precision == "fp16"
    assert load_config(_yaml(tmp_path, "d.yaml", "bf16: false\n")).mixed_precision == "no"
    # a file's `fp16: false` leaves the defaults' bf16 in place; `bf16: false` turns it off
    assert load_config(_yaml(tmp_path, "e.yaml", "fp16: false\n"), base={"mixed_precision": "bf16"}).mixed_precision == "bf16"
    assert load_config(_yaml(tmp_path, "f.yaml", "bf16: false\n"), base={"mixed_precision": "bf16"}).mixed_precision == "no"


def test_several_config_files_merge_and_a_setting_in_two_of_them_names_both(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = _yaml(tmp_path, "a.yaml", "max_steps: 3\nloss: {beta: 0.1}\n")
    b = _yaml(tmp_path, "b.yaml", "seed: 7\ngeneration: {max_new_tokens: 9}\n")
    cfg, _ = load_recipe_config([a, b], ["--seed", "8"])
    assert (cfg.max_steps, cfg.loss.beta, cfg.generation.max_new_tokens, cfg.seed) == (3, 0.1, 9, 8)  # flags win
    c = _yaml(tmp_path, "c.yaml", "max_completion_length: 16\n")  # the same setting as b's, by TRL's name
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", "--config", str(a), "--config", str(b), "--config", str(c)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "setting 'generation.max_new_tokens'" in err and f"{b} and {c}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("words, named", [
    (["--max-steps", "3", "--max_steps", "4"], "max_steps"),
    (["--beta", "0.1", "--loss.beta", "0.2"], "loss.beta"),
    (["--max_completion_length", "8", "--generation.max_new_tokens", "9"], "generation.max_new_tokens"),
])
def test_a_flag_given_again_replaces_the_earlier_one_and_says_so(words, named, capsys):
    cfg = load_config(None, words)
    section, _, field = named.rpartition(".")
    assert str(getattr(getattr(cfg, section) if section else cfg, field)) == words[3]
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"setting '{named}': {words[2]}: ") and \
        f"replaces {words[0]}: " in err and "given earlier on the command line" in err, err


def test_list_flags_still_add_entries_and_the_command_line_wins_over_a_file(tmp_path):
    cfg = load_config(None, ["--reward", "a:b", "--reward", "c:d"])
    assert cfg.data.rewards == ["a:b", "c:d"]
    cfg = load_config(_yaml(tmp_path, "a.yaml", "max_steps: 3\n"), ["--max-steps", "5"])
    assert cfg.max_steps == 5




def _experiment(tmp_path, grpo: str = "", extra: str = ""):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(TOY_EXPERIMENT).format(out=tmp_path / "runs", grpo=grpo, extra=extra))
    return path


def test_an_experiment_refuses_a_repeated_key_a_repeated_set_and_two_spellings(tmp_path):
    assert read_experiment(_experiment(tmp_path), ["grpo.max_steps=4"]).stages["grpo"]["max_steps"] == 4
    with pytest.raises(ExperimentError, match=r"exp.yaml:\d+:\d+: duplicate key 'eval' \(first set on line \d+\)"):
        read_experiment(_experiment(tmp_path, extra="eval: {splits: [ood], size: 2}\n"), [])
    with pytest.raises(ExperimentError, match=r"--set grpo.max_steps is given twice \('grpo.max_steps=4' and "
                                              r"'grpo.max_steps=5'\)"):
        read_experiment(_experiment(tmp_path), ["grpo.max_steps=4", "grpo.max_steps=5"])
    with pytest.raises(ExperimentError, match=r"grpo sets it twice, as max_completion_length: 8 and as "
                                              r"generation.max_new_tokens: 16"):
        read_experiment(_experiment(tmp_path, grpo=", max_completion_length: 8, generation: {max_new_tokens: 16}"), [])
    with pytest.raises(ExperimentError, match=r"--set grpo.loss.beta: '\[1,' is not valid YAML"):
        read_experiment(_experiment(tmp_path), ["grpo.loss.beta=[1,"])




@pytest.mark.parametrize("levels, width", [(9, 9), (5, 40), (20, 2)])
def test_nested_aliases_that_expand_past_the_bound_are_refused_before_anything_is_built(levels, width, tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _yaml(tmp_path, "bomb.yaml", nested_aliases(levels, width))
    assert len(path.read_bytes()) < 2_000
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aliases expand to more than 100,000 values" in err and str(path) in err, err
    exp = _experiment(tmp_path, extra=nested_aliases(levels, width))
    with pytest.raises(ExperimentError, match="aliases expand to more than"):
        read_experiment(exp, [])


def test_a_few_aliases_still_read(tmp_path):
    cfg = load_config(_yaml(tmp_path, "a.yaml", "max_steps: &n 3\nlogging: {save_every: *n}\n"))
    assert cfg.max_steps == cfg.logging.save_every == 3
