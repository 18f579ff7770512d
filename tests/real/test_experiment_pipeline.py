"""The SmolLM2-learns-to-see experiment (examples/smollm2_learns_to_see.yaml, docs/smollm2-learns-to-see.md) run by
its documented command at toy scale: every stage of the base pipeline runs on the real SmolLM2 and the example's
tower, a second run skips what finished, a stage stopped part-way resumes from its checkpoint, and the summary holds
the table the docs page reports. The arms (controls, GRPO variants) and their comparisons in the summary run on tiny
twins in tests/grpo/test_experiment_arms.py; here the example's arms are left out (arms={})."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.real.marks import REAL
from vlm_grpo.cli import main

pytestmark = REAL

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_learns_to_see.yaml"
TOY = [  # a few steps per stage, a few samples, short answers
    "compose.tower_pretrain.steps=3", "compose.tower_pretrain.batch_size=4",
    "align.words.steps=2", "align.words.batch_size=4", "sft.max_steps=2", "sft.data.batch_size=4",
    "grpo.max_steps=2", "grpo.data.batch_size=2", "grpo.data.num_generations=2",
    # a float32 SmolLM2 checkpoint is 0.9 GB with its optimizer: GRPO keeps step 1's (the resume test's), SFT and
    # GRPO end in their final models only
    "grpo.logging.save_every=1", "grpo.logging.checkpoint_at_end=false", "sft.logging.checkpoint_at_end=false",
    "sft.generation.max_new_tokens=6", "grpo.generation.max_new_tokens=6", "eval.size=3", "eval.eval_batch_size=3",
    "eval.max_new_tokens=6", "arms={}",
    "eval.splits=[val]", "eval.test_splits=[test]",
    # float32 here: the wiring is what this test proves, and bf16 matmuls crawl on a CPU without bf16 units (AVX2
    # only); bf16 training and resume are tested on the tiny twins (tests/grpo/test_bf16.py)
    "sft.mixed_precision='no'", "grpo.mixed_precision='no'",
]


def experiment(out: Path, *args: str, llm: Path | None = None) -> int:
    # the LM: the example's GGUF, converted once for the whole test run (the GGUF path itself: test_smollm2_hybrid)
    sets = [a for s in [*TOY, f"output_dir={out}", *([f"compose.llm={llm}"] if llm else [])] for a in ("--set", s)]
    return main(["experiment", str(EXAMPLE), *sets, *args])


@pytest.fixture(scope="module")
def finished(tmp_path_factory, smollm2_dir):
    out = tmp_path_factory.mktemp("experiment") / "run"
    assert experiment(out, "--seed", "0", "--summary", llm=smollm2_dir) == 0
    yield out
    shutil.rmtree(out.parent, ignore_errors=True)  # gigabytes: gone when this file's tests are


def test_every_stage_ran_and_the_summary_holds_the_table(finished, capsys):
    base, seed = finished / "base-seed0", finished / "seed0"
    for stage in (base / "compose", base / "align", seed / "sft", seed / "grpo", seed / "eval"):
        assert json.loads((stage / "stage.json").read_text())["seconds"] > 0
    # the random tower was pretrained on the scenes' cells, then composed
    composed = json.loads((base / "compose" / "stage.json").read_text())
    assert 0 <= composed["patch_accuracy_before"] <= 1 and 0 <= composed["patch_accuracy_after"] <= 1
    assert (base / "compose" / "tower" / "config.json").is_file()
    # the projector was aligned to the LM's words for each cell
    aligned = json.loads((base / "align" / "stage.json").read_text())
    assert aligned["method"] == "words" and 0 <= aligned["nearest_words_after"] <= 1
    assert (base / "align" / "final" / "manifest.json").is_file()
    for model in ("sft", "grpo"):
        assert (seed / model / "final" / "config.json").is_file()
    # SFT under the blog post's freeze policy: the projector's output layer learns, the tower and late LM layers stay
    aligned = load_file(base / "align" / "final" / "model.safetensors")
    tuned = load_file(seed / "sft" / "final" / "model.safetensors")
    out_layer = "multi_modal_projector.linear_2.weight"
    assert not torch.equal(aligned[out_layer].float(), tuned[out_layer].float())
    frozen = [k for k in aligned if k.startswith(("vision_tower.", "language_model.model.layers.29."))]
    assert frozen and all(torch.equal(aligned[k].float(), tuned[k].float()) for k in frozen)
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["seeds"] == [0] and list(summary["splits"]) == ["val"]  # the test split waits for --test
    table = summary["splits"]["val"]
    for model in ("base", "sft", "grpo"):
        acc = table["models"][model]["all"]["accuracy"]
        assert acc["questions"] == 3 and 0 <= acc["mean"] <= 1
        assert table["models"][model]["all"]["image_dependent"] is not None
    # every model is asked the GRPO stage's questions (both kinds), though SFT saw colour questions only
    assert set(table["kinds"]) <= {"all", "colour", "kind"} and table["baseline"]["all"]["n"] == 3
    assert "grpo - sft" in table["comparisons"] and table["verdict"]["best_control"] == "sft"
    text = (finished / "summary.md").read_text()
    assert "## val (validation)" in text and "the best control" in text


def test_a_second_run_skips_the_finished_stages(finished, smollm2_dir, capsys):
    capsys.readouterr()
    assert experiment(finished, "--seed", "0", llm=smollm2_dir) == 0
    said = capsys.readouterr().out
    for stage in ("compose", "align", "sft", "grpo"):
        assert f"[seed 0] {stage}: done earlier" in said


def test_a_stage_stopped_part_way_resumes_from_its_checkpoint(finished, smollm2_dir, capsys):
    grpo = finished / "seed0" / "grpo"
    # as a run stopped after its first step leaves it: the step-1 checkpoint, no final model, not marked done
    (grpo / "stage.json").unlink()
    shutil.rmtree(grpo / "final")
    assert [p.name for p in grpo.glob("checkpoint-*")] == ["checkpoint-1"]
    capsys.readouterr()
    assert experiment(finished, "--seed", "0", "--stages", "grpo", llm=smollm2_dir) == 0
    said = capsys.readouterr().out
    assert "[seed 0] grpo: 2 steps into" in said and "(resumed)" in said
    assert (grpo / "final" / "config.json").is_file() and json.loads((grpo / "stage.json").read_text())["resumed"] is True


def test_a_stage_before_its_input_names_the_missing_stage(tmp_path, capsys):
    assert experiment(tmp_path / "empty", "--seed", "0", "--stages", "sft") != 0
    assert "sft starts from the align stage, which has not finished" in capsys.readouterr().err
