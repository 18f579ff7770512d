"""run_state.json from someone else is checked before use (one line naming the file and field, nothing written);
trust is given per command, never by YAML or a saved run; compose never waits on a y/N prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.safe_loading import load_state_file
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config, to_yaml, without_trust

GOOD = {"step": 2, "config": {"seed": 0}, "num_processes": 1, "stage": "grpo", "fsdp": "no",
        "history": [{"resumed_at_step": 1, "from": "runs/x/checkpoint-1", "changed": {"max_steps": {"was": 1, "now": 2}}}]}
BAD = [  # (run_state.json text, the field the error names)
    ("[]", "(the file)"), ("not json", "(the file)"), ('"text"', "(the file)"), ("\xff", "(the file)"),
    (json.dumps({**GOOD, "step": "2"}), "step"), (json.dumps({**GOOD, "step": -1}), "step"),
    (json.dumps({**GOOD, "step": True}), "step"), (json.dumps({**GOOD, "step": 10**12}), "step"),
    (json.dumps({**GOOD, "config": []}), "config"), (json.dumps({**GOOD, "num_processes": 0}), "num_processes"),
    (json.dumps({**GOOD, "stage": "evil"}), "stage"), (json.dumps({**GOOD, "stage": 3}), "stage"),
    (json.dumps({**GOOD, "fsdp": "x" * 100}), "fsdp"), (json.dumps({**GOOD, "surprise": 1}), "surprise"),
    (json.dumps({**GOOD, "history": {}}), "history"), (json.dumps({**GOOD, "history": [1]}), "history"),
    (json.dumps({**GOOD, "history": [{"from": "x"}]}), "history"),
    (json.dumps({**GOOD, "history": [{"resumed_at_step": 1, "from": 5}]}), "history"),
    (json.dumps({**GOOD, "history": [{"resumed_at_step": 1, "from": "x" * 5000}]}), "history"),
    (json.dumps({**GOOD, "history": [{"resumed_at_step": 1, "from": "x", "evil": 1}]}), "history"),
    (json.dumps({**GOOD, "history": [{"resumed_at_step": 1, "from": "x", "changed": {"k": 1}}]}), "history"),
    (json.dumps({**GOOD, "history": [GOOD["history"][0]] * 10_001}), "history"),
    (json.dumps({**GOOD, "config": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": {}}}}}}}}}}}), "config."),
    (json.dumps({**GOOD, "optimizer_updates": 1.5}), "optimizer_updates"),
    (json.dumps({**GOOD, "guards": "x"}), "guards"),
]


def checkpoint(tmp_path: Path, run_state: str) -> Path:
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    (folder / ckpt.STATE_FILE).write_text(json.dumps({"global_step": 2, "log_history": [{"step": 1}]}))
    (folder / ckpt.RUN_STATE_FILE).write_bytes(run_state.encode("utf-8", "surrogateescape"))
    return folder


def test_a_good_run_state_reads_back(tmp_path):
    state = ckpt.read_states(checkpoint(tmp_path, json.dumps(GOOD)))
    assert state["step"] == 2 and state["history"] == GOOD["history"]


@pytest.mark.parametrize("text, field", BAD, ids=[f"bad{k}" for k in range(len(BAD))])
def test_a_malformed_run_state_is_refused_in_one_line_naming_file_and_field(tmp_path, text, field):
    folder = checkpoint(tmp_path, text)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(SettingError) as refused:
        ckpt.read_states(folder)
    message = str(refused.value)
    assert "\n" not in message and f"{folder / ckpt.RUN_STATE_FILE}: field `{field}" in message
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing written


def test_a_malformed_trainer_state_is_refused_too(tmp_path):
    folder = checkpoint(tmp_path, json.dumps(GOOD))
    (folder / ckpt.STATE_FILE).write_text(json.dumps({"global_step": 2, "log_history": [{"step": "1"}]}))
    with pytest.raises(SettingError, match="field `log_history\\[0\\].step` must be a whole number"):
        ckpt.read_states(folder)


# ---------------------------------------------------------------- trust
@pytest.mark.parametrize("text, key", [
    ("trust_checkpoint: true\n", "trust_checkpoint"), ("trust-checkpoint: true\n", "trust_checkpoint"),
    ("model:\n  trust_remote_code: true\n", "model.trust_remote_code"),
    ("model.trust_remote_code: true\n", "model.trust_remote_code"), ("trust_remote_code: false\n", "model.trust_remote_code"),
    ("model:\n  allow_pickle_weights: true\n", "model.allow_pickle_weights"),
    ("allow-pickle-weights: true\n", "model.allow_pickle_weights"),
])
def test_a_trust_key_in_yaml_is_refused_by_name(tmp_path, text, key):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(SettingError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"setting '{key}'") and "never by a file" in str(refused.value)


def test_an_experiment_file_may_set_no_trust_key_either(tmp_path):
    from vlm_grpo.experiment.plan import read_experiment

    path = tmp_path / "exp.yaml"
    path.write_text("compose: {llm: smollm2, vision: v}\ngrpo:\n  model: {allow_pickle_weights: true}\n")
    with pytest.raises(SettingError, match="setting 'model.allow_pickle_weights'.*never by a file"):
        read_experiment(path)


def test_trust_comes_from_the_command_line_and_is_never_saved():
    cfg = load_config(None, ["--trust-checkpoint", "--trust-remote-code", "--model.allow_pickle_weights", "true"])
    assert cfg.trust_checkpoint and cfg.model.trust_remote_code and cfg.model.allow_pickle_weights
    saved = to_yaml(cfg)
    assert "trust_checkpoint" not in saved and "trust_remote_code" not in saved  # config.yaml
    assert "allow_pickle_weights" not in saved
    kept = without_trust(cfg.to_dict())  # what run_state.json's config holds
    assert "trust_checkpoint" not in kept and "trust_remote_code" not in kept["model"]
    assert "allow_pickle_weights" not in kept["model"]
    assert not load_config(None, []).trust_checkpoint  # a resume given no flag does not trust


def test_a_resume_must_be_given_the_flag_again_and_each_use_is_announced(tmp_path, capsys):
    import numpy as np
    import torch

    from tests.reliability.conftest import RUN
    from vlm_grpo.cli import main

    run = tmp_path / "run"
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(run), "--trust-checkpoint"]) == 0
    point = run / "checkpoint-1"
    assert "trust" not in (run / "config.yaml").read_text() and "trust" not in (point / ckpt.RUN_STATE_FILE).read_text()
    state = torch.load(point / "rng_state.pt", weights_only=True)
    torch.save({**state, "numpy": np.arange(3)}, point / "rng_state.pt")  # needs full unpickling now
    from vlm_grpo.grpo.checkpoint.manifest import write_manifest

    write_manifest(point)
    capsys.readouterr()
    again = ["train", *RUN, "--max-steps", "2", "--output-dir", str(run), "--resume"]
    assert main(again) == 1  # the flag of the first run is not inherited
    assert "--trust-checkpoint" in capsys.readouterr().err
    assert main([*again, "--trust-checkpoint"]) == 0
    err = capsys.readouterr().err
    assert f"warning: --trust-checkpoint: unpickling {point / 'rng_state.pt'} in full" in err


def test_the_trusted_unpickling_warns_naming_the_file(tmp_path, capsys):
    import numpy as np
    import torch

    torch.save({"a": np.arange(2)}, tmp_path / "x.pt")
    load_state_file(tmp_path / "x.pt", trust=True)
    assert capsys.readouterr().err == f"warning: --trust-checkpoint: unpickling {tmp_path / 'x.pt'} in full (any code it holds runs now)\n"


def test_compose_refuses_a_donor_with_code_without_prompting_when_stdin_is_closed(tmp_path):
    donor = tmp_path / "lm"
    donor.mkdir()
    marker = tmp_path / "code-ran"
    (donor / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["EvilLM"],
                                                   "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilLM"}}))
    (donor / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    done = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "compose", "--vision", "tiny:qwen2_5_vl", "--llm",
                           str(donor), "--out", str(tmp_path / "out")], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "ships its own Python code (modeling_evil.EvilLM)" in done.stderr and "--trust-remote-code" in done.stderr
    assert "[y/N]" not in done.stdout + done.stderr and not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("config", ["config.json", "tokenizer_config.json", "preprocessor_config.json",
                                    "processor_config.json"])
def test_code_beside_a_gguf_is_refused_naming_the_folder_not_the_gguf(tmp_path, config, capsys):
    from vlm_grpo.cli import main

    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(b"GGUF")
    (folder / config).write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok_evil.Evil", None]}}))
    assert main(["convert-gguf", "--gguf", str(folder / "m.gguf"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"the folder of m.gguf, {folder} ships its own Python code (tok_evil.Evil, None)" in err, err
    assert "not a GGUF" not in err and "runs no shipped code" in err and not (tmp_path / "out").exists()


def test_a_model_folder_whose_tokenizer_ships_code_is_refused_before_loading(tmp_path):
    from vlm_grpo.loader import load_model

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": "tok.Evil"}}))
    with pytest.raises(ValueError, match="ships its own Python code \\(tok.Evil\\).*--trust-remote-code"):
        load_model(str(folder), decide_cache=False)
