"""The experiment's arms on tiny twins, by its command: GRPO and its controls start from the same SFT checkpoint and
see GRPO's prompts (answer-only SFT on the shape prompts, rejection-sampling fine-tuning on the completions the reward
accepts, SFT trained on for as many rows, a GRPO variant), every seed composes its own tower, validation splits are
answered by default and test splits only with --test, GRPO logs its answer marginal, and the summary holds the
table (vlm_grpo/experiment/arms.py, table.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from vlm_grpo.adapters.twins.hybrid_llava import TINY_LM
from vlm_grpo.adapters.twins.qwen2_5_vl import qwen2_lm
from vlm_grpo.cli import main
from vlm_grpo.recipes.scene_count import RECIPE

TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
             patch_size=8)
TASK = {"recipe": "scene_count", "recipe_options": {"task": "attribute", "image_size": 32}, "train_size": 1000}
RUN = {"max_steps": 1, "generation": {"max_new_tokens": 4}, "mixed_precision": "no",
       "logging": {"plot": False, "report": False, "progress": False}}


def even_is_right(completions, **_):
    """Random weights never answer right: call every completion of even length right, so some are kept."""
    return [2.0 if len(c) % 2 == 0 else 0.0 for c in completions]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("arms")
    lm, tokenizer = qwen2_lm(dict(TINY_LM, tie_word_embeddings=True), 4)
    lm.save_pretrained(root / "lm")
    tokenizer.save_pretrained(root / "lm")
    config = {
        "name": "tiny", "output_dir": str(root / "runs"), "independent_seeds": True,
        "compose": {"llm": str(root / "lm"), "tower": TOWER},
        "align": {"data": {"recipe": "scene_count", "recipe_options": {"task": "caption", "image_size": 32}},
                  "words": {"steps": 1, "batch_size": 2, "learning_rate": 1e-3}},
        "sft": {**RUN, "data": {**TASK, "recipe_options": {**TASK["recipe_options"], "asks": "colour"}, "batch_size": 2}},
        "grpo": {**RUN, "data": {**TASK, "batch_size": 4, "num_generations": 2}},
        "arms": {"answer_sft": {"method": "answer_sft", "question_types": ["kind"]}, "rft": {"method": "rft"},
                 "sft_more": {"method": "sft_more"},
                 "grpo_hot": {"method": "grpo", "set": {"generation": {"max_new_tokens": 4, "temperature": 1.5}}}},
        "eval": {"splits": ["val"], "test_splits": ["test"], "size": 3, "eval_batch_size": 3, "max_new_tokens": 4,
                 "data_seed": 1},
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    patch = pytest.MonkeyPatch()
    patch.setattr(RECIPE.rewards[1], "fn", even_is_right)
    try:
        assert main(["experiment", str(path), "--seed", "0", "1"]) == 0
        assert main(["experiment", str(path), "--seed", "0", "--stages", "eval", "--test", "--summary"]) == 0
    finally:
        patch.undo()
    return root / "runs", path


def test_every_arm_starts_from_the_sft_checkpoint_and_trains(run):
    out, _ = run
    for arm in ("answer_sft", "rft", "sft_more", "grpo_hot"):
        stage = out / "seed0" / arm
        assert json.loads((stage / "stage.json").read_text())["steps"] >= 1, arm
        assert (stage / "final" / "config.json").is_file(), arm
    # sft_more: as many rows as GRPO's 4 prompts, at SFT's batch of 2
    assert json.loads((out / "seed0" / "sft_more" / "stage.json").read_text())["steps"] == 2
    # answer_sft: GRPO's shape prompts only
    answer = json.loads((out / "seed0" / "answer_sft" / "stage.json").read_text())
    assert answer["grpo_prompts"] == 4 and 1 <= answer["rows"] <= 4 and answer["steps"] == -(-answer["rows"] // 2)


def test_rft_keeps_only_what_the_reward_accepts_of_g_samples_per_grpo_prompt(run):
    out, _ = run
    kept = json.loads((out / "seed0" / "rft.accepted.json").read_text())
    assert kept["prompts"] == 4 and kept["sampled"] == 4 * 2  # GRPO's prompts, G = 2 each
    assert kept["accepted"] == len(kept["rows"]) >= 1
    assert all(len(r["completion"]) % 2 == 0 for r in kept["rows"])  # the reward's choice, nothing else
    facts = json.loads((out / "seed0" / "rft" / "stage.json").read_text())
    assert facts["accepted"] == kept["accepted"] and facts["steps"] >= 1


def test_each_seed_has_its_own_base_and_grpo_logs_its_answer_marginal(run):
    out, _ = run
    for seed in (0, 1):
        assert json.loads((out / f"base-seed{seed}" / "compose" / "stage.json").read_text())["seed"] == seed
    metrics = [json.loads(line) for line in (out / "seed0" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    shares = [m for m in metrics if "guards/answer_share" in m]
    assert shares and all(0 < m["guards/answer_share"] <= 1 for m in shares)
    assert any(k.startswith("guards/answer_share/") for m in shares for k in m)


def test_the_answer_marginal_recomputed_from_completions_is_what_the_run_logged(run):
    """scripts/answer_marginal.py rebuilds a run's training samples from its config.yaml to give older runs the
    right answers' share: on a run that logged both, its figures are the logged ones."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("answer_marginal",
                                                  Path(__file__).parents[2] / "scripts" / "answer_marginal.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, _ = run
    grpo = out / "seed0" / "grpo"
    logged = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
    logged = {m["step"]: {k: v for k, v in m.items() if "answer_share" in k} for m in logged if "guards/answer_share" in m}
    again = {m["step"]: {k: v for k, v in m.items() if k != "step"} for m in script.step_shares(grpo)}
    assert again == logged and any(k.startswith("guards/right_answer_share") for m in again.values() for k in m)


def test_test_splits_only_with_test_and_the_summary_holds_the_table(run):
    out, _ = run
    assert (out / "seed0" / "eval" / "grpo-test.json").is_file()
    assert not (out / "seed1" / "eval" / "grpo-test.json").is_file()  # seed 1 ran without --test
    assert (out / "seed1" / "eval" / "rft-val.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["independent_seeds"] is True
    assert list(summary["splits"]) == ["val"]  # seed 1 has no test report: the test table waits for every seed
    table = summary["splits"]["val"]
    assert table["role"] == "validation"
    for model in ("base", "sft", "grpo", "answer_sft", "rft", "sft_more", "grpo_hot"):
        acc = table["models"][model]["all"]["accuracy"]
        assert acc["seeds"] == 2 and acc["questions"] == 3 and acc["across_seeds"]["df"] == 1
        assert table["models"][model]["all"]["image_dependent"] is not None
    assert {"grpo - rft", "grpo - answer_sft", "grpo - sft_more", "grpo - sft", "grpo_hot - rft"} <= set(table["comparisons"])
    assert table["verdict"]["best_control"] in ("sft", "answer_sft", "rft", "sft_more")
    assert table["baseline"]["all"]["n"] == 3
    rows = json.loads((out / "reports" / "seed1" / "rft-val.json").read_text())
    assert len(rows) == 3 and {"index", "type", "answer", "stated", "correct", "blank_correct"} == set(rows[0])
    text = (out / "summary.md").read_text()
    assert "## val (validation)" in text and "the best control" in text and "Answer marginal while GRPO trained" in text


def test_each_eval_run_adds_to_the_time_the_earlier_ones_recorded(run):
    out, path = run
    first = json.loads((out / "seed0" / "eval" / "stage.json").read_text())
    assert set(first["seconds_by_split"]) == {"val", "test"}  # the --test run kept the validation run's time
    assert first["seconds"] >= sum(first["seconds_by_split"].values()) > 0
    assert set(json.loads((out / "seed1" / "eval" / "stage.json").read_text())["seconds_by_split"]) == {"val"}
    assert main(["experiment", str(path), "--seed", "0", "--stages", "eval", "--test"]) == 0  # nothing left to answer
    again = json.loads((out / "seed0" / "eval" / "stage.json").read_text())
    assert again["seconds_by_split"] == first["seconds_by_split"] and again["seconds"] >= first["seconds"]


def test_eval_answers_every_finished_model_before_it_names_the_stage_still_training(run, capsys):
    """An arm still training does not hold up the reports of the models after it: they are written, the run then
    stops naming the unfinished stage, and once it finishes the same command answers only its reports."""
    out, path = run
    arm = out / "seed1" / "answer_sft" / "stage.json"
    aside = arm.with_name("stage.json.finished")
    reports = {m: out / "seed1" / "eval" / f"{m}-val.json" for m in ("answer_sft", "sft_more")}  # in the models' order
    arm.rename(aside)  # as while the stage trains
    for report in reports.values():
        report.unlink()
    capsys.readouterr()
    try:
        assert main(["experiment", str(path), "--seed", "1", "--stages", "eval"]) != 0
    finally:
        aside.rename(arm)
    assert "these stages have not finished: answer_sft" in capsys.readouterr().err
    assert reports["sft_more"].is_file() and not reports["answer_sft"].is_file()
    later = reports["sft_more"].read_text()
    assert main(["experiment", str(path), "--seed", "1", "--stages", "eval"]) == 0
    assert reports["answer_sft"].is_file() and reports["sft_more"].read_text() == later  # answered once


def test_a_finished_stage_is_reused_only_under_the_settings_it_ran_with(run, capsys):
    """An arm edited after it finished (a hotter temperature, more steps, another method) is not silently taken for
    the old model: the run stops naming each change; a change a resume would honour (logging) reuses it."""
    out, path = run
    config = yaml.safe_load(path.read_text())
    edited = path.with_name("edited.yaml")

    def again(change) -> tuple[int, str]:
        data = json.loads(json.dumps(config))
        change(data)
        edited.write_text(yaml.safe_dump(data))
        capsys.readouterr()
        code = main(["experiment", str(edited), "--seed", "0", "--stages", "sft,grpo_hot,sft_more"])
        return code, capsys.readouterr().err

    code, err = again(lambda c: c["arms"]["grpo_hot"]["set"]["generation"].update(temperature=0.7))
    assert code != 0 and "grpo_hot finished" in err and "generation.temperature 1.5 -> 0.7" in err
    code, err = again(lambda c: c["sft"].update(max_steps=5))
    assert code != 0 and "sft finished" in err and "max_steps 1 -> 5" in err
    code, err = again(lambda c: c["arms"]["sft_more"].update(method="answer_sft"))
    assert code != 0 and "arm.method 'sft_more' -> 'answer_sft'" in err
    code, err = again(lambda c: c["sft"]["logging"].update(plot=True))
    assert code == 0, err
    assert json.loads((out / "seed0" / "grpo_hot" / "stage-settings.json").read_text())["generation"]["temperature"] == 1.5


def test_a_stopped_rft_stage_fine_tunes_again_on_the_completions_it_kept(run, capsys):
    """Sampling is the costly half of RFT: a stage stopped after it resumes from the kept completions, not a new draw."""
    import shutil

    out, path = run
    kept = out / "seed1" / "rft.accepted.json"
    before = kept.read_text()
    shutil.rmtree(out / "seed1" / "rft")  # as a run stopped before its first checkpoint leaves it
    capsys.readouterr()
    patch = pytest.MonkeyPatch()
    patch.setattr("vlm_grpo.experiment.arms.sample_and_keep", lambda *a, **k: pytest.fail("sampled again"))
    try:
        assert main(["experiment", str(path), "--seed", "1", "--stages", "rft"]) == 0
    finally:
        patch.undo()
    assert "accepted earlier" in capsys.readouterr().out and kept.read_text() == before
    assert json.loads((out / "seed1" / "rft" / "stage.json").read_text())["accepted"] == json.loads(before)["accepted"]


def test_a_stage_runs_in_one_command_at_a_time_and_other_stages_run_beside_it(run, capsys):
    """Two commands on one seed would write one stage folder at once (compose and align clear the partial work, two
    evals write the same reports): the second is refused naming the first; another stage of that seed still runs."""
    import os

    from vlm_grpo.experiment.plan import read_experiment
    from vlm_grpo.experiment.stage_lock import stage_lock

    out, path = run
    exp = read_experiment(str(path), [])
    for stage in ("eval", "compose"):
        report = out / "seed1" / "eval" / "sft-val.json"
        before = report.read_text()
        report.unlink()  # something left to answer
        holder = stage_lock(exp, stage, 1)
        holder.acquire()
        try:
            capsys.readouterr()
            assert main(["experiment", str(path), "--seed", "1", "--stages", f"{stage},eval"]) != 0
            err = capsys.readouterr().err
            assert f"seed 1: stage {stage} " in err and f"is being run by another command: process {os.getpid()} " in err
            assert not report.exists()  # refused before it answered anything
            assert main(["experiment", str(path), "--seed", "1", "--stages", "sft_more"]) == 0  # another stage: runs
        finally:
            holder.release()
        assert main(["experiment", str(path), "--seed", "1", "--stages", f"{stage},eval"]) == 0
        again = json.loads(report.read_text())  # answered once the first command ended (the same greedy answers)
        assert [s["completion"] for s in again["samples"]] == [s["completion"] for s in json.loads(before)["samples"]]
