"""Outputs written where the user points follow the run directory's rule: `save_model(dir)` into a folder of the
user's own files, `eval`'s and `report --out`'s and `audit-rewards --json`'s files, never overwrite what this program
did not write: it is moved aside, whole, and the message names both paths."""

from __future__ import annotations

import json

from tests.api.test_trl_script_behaviour import TINY, length, rows
from vlm_grpo import GRPOConfig, GRPOTrainer
from vlm_grpo.grpo.heldout_eval import write_report
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run import outputs

USERS = {"README.md": "my notes\n", "config.json": '{"mine": true}\n', "model.safetensors": "my weights"}


def test_save_model_into_a_folder_of_the_users_files_moves_them_aside_and_a_second_save_replaces_its_own(
        tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    for name, text in USERS.items():
        (out / name).write_text(text)
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows(),
                          args=GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, save_strategy="no", **TINY))
    trainer.save_model(str(out))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.replaced-")]
    assert len(aside) == 1 and {p.name: p.read_text() for p in aside[0].iterdir()} == USERS
    assert f"{out} held files (README.md, config.json, model.safetensors) this program did not write: moved it to " \
           f"{aside[0]}" in capsys.readouterr().out
    assert (out / "model.safetensors").read_bytes() != b"my weights" and outputs.earlier_save(out)
    trainer.save_model(str(out))  # its own earlier save: replaced, nothing more moved aside
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("out.replaced-")]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-save-")]


def test_a_report_file_the_user_names_never_overwrites_their_file(tmp_path, capsys):
    mine = tmp_path / "results.json"
    mine.write_text("my results\n")
    write_report({"accuracy": 0.5}, mine)
    assert json.loads(mine.read_text()) == {"accuracy": 0.5}
    aside = next(tmp_path.glob("results.json.replaced-*"))
    assert aside.read_text() == "my results\n" and str(aside) in capsys.readouterr().out


def test_in_a_run_directory_the_run_s_own_eval_file_is_replaced_and_a_users_moved_aside(tmp_path):
    safe_files.write_run_file(tmp_path, "config.yaml", "a: 1\n")  # a run directory
    write_report({"n": 1}, tmp_path / "eval-test.json")
    write_report({"n": 2}, tmp_path / "eval-test.json")  # the run's own: replaced
    assert not list(tmp_path.glob("*.replaced-*")) and "eval-test.json" in safe_files.CreatedFiles(tmp_path).names()
    (tmp_path / "eval-mine.json").write_text("mine\n")
    write_report({"n": 3}, tmp_path / "eval-mine.json")
    assert next(tmp_path.glob("eval-mine.json.replaced-*")).read_text() == "mine\n"


def test_report_out_and_audit_json_move_the_users_file_aside(tmp_path):
    from vlm_grpo.cli import main
    from vlm_grpo.inspect.report import write_report as write_html

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    page = tmp_path / "page.html"
    page.write_text("my page")
    write_html(tmp_path, page)
    assert "vlm-grpo report" in page.read_text() and next(tmp_path.glob("page.html.replaced-*")).read_text() == "my page"
    audit = tmp_path / "audit.json"
    audit.write_text("my audit")
    assert main(["audit-rewards", "--samples", "2", "--data.recipe_options", "{image_size: 64}", "--json",
                 str(audit)]) == 0
    assert "samples" in json.loads(audit.read_text()) and next(tmp_path.glob("audit.json.replaced-*")).read_text() == \
        "my audit"


def test_a_save_into_the_run_directory_goes_file_by_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    safe_files.write_run_path(run, "checkpoint-1/model.safetensors", b"ckpt")
    (run / "README.md").write_text("my notes\n")
    for _ in range(2):
        staging = outputs.staging_for(run)
        (staging / "README.md").write_text("card\n")
        (staging / "model.safetensors").write_bytes(b"w")
        outputs.commit_folder(staging, run)
    assert (run / "checkpoint-1" / "model.safetensors").read_bytes() == b"ckpt" and (run / "README.md").read_text() == "card\n"
    assert [p.read_text() for p in run.glob("README.md.replaced-*")] == ["my notes\n"]  # moved once, then replaced
    assert {"README.md", "model.safetensors", "checkpoint-1"} <= safe_files.CreatedFiles(run).names()
