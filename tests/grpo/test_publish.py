"""What a run leaves for others: the model card in final/, the trackers' logs, and a push to a (local) hub."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import constants

from tests.grpo.fake_hub import FakeHub
from vlm_grpo.cli import main
from vlm_grpo.grpo.run import tracker_setup as trackers
from vlm_grpo.grpo.checkpoint.manifest import verify

RUN = ["--model", "tiny:smolvlm", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
       "--logging.progress", "false", "--max-steps", "2", "--eval.before_after", "--eval.size", "3",
       "--eval-batch-size", "3", "--log-completions", "false"]


def _scalars(run_dir) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[float]] = {}
    for events in sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")}):  # + accelerate's hparams folder
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return scalars


def test_model_card_and_tensorboard_hold_the_held_out_results(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *RUN, "--output-dir", str(run), "--report-to", "tensorboard", "--logging.plot", "true"]) == 0
    before, after = (json.loads((run / f"eval-{w}.json").read_text()) for w in ("before", "after"))
    card = (run / "final" / "README.md").read_text()
    assert "from `tiny:smolvlm` (smolvlm family)" in card and "`shapes`" in card
    assert "`correctness` (x1), `description` (x1), `reasoning` (x1)" in card  # the values are the rewards' own
    assert f"| before | {before['accuracy']:.1%} | {before['reward']:.3f} |" in card
    assert f"| after | {after['accuracy']:.1%} | {after['reward']:.3f} |" in card
    assert "![training curves](training_curves.png)" in card and (run / "final" / "training_curves.png").is_file()
    assert (run / "final" / "vlm_grpo_config.yaml").read_text() == (run / "config.yaml").read_text()
    assert verify(run / "final") == []  # the manifest covers the card
    scalars = _scalars(run)
    assert scalars["eval/accuracy"] == [before["accuracy"], after["accuracy"]]
    assert len(scalars["rewards/correctness"]) == 2 and len(scalars["reward"]) == 2


def test_a_tracker_that_is_not_installed_stops_the_run_before_it_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", "no_such_package_for_vlm_grpo")
    assert main(["train", *RUN, "--output-dir", str(tmp_path / "run"), "--report-to", "wandb"]) == 2
    assert "setting 'logging.report_to': wandb not installed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_push_to_hub_uploads_weights_and_card(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    try:
        assert main(["train", *RUN, "--output-dir", str(tmp_path / "run"), "--push-to-hub", "--hub-model-id",
                     "me/tiny-grpo"]) == 0
    finally:
        hub.close()
    pushed = tmp_path / "hub" / "me" / "tiny-grpo"
    local = tmp_path / "run" / "final"
    for name in ("model.safetensors", "config.json", "README.md", "vlm_grpo_config.yaml", "manifest.json"):
        assert (pushed / name).read_bytes() == (local / name).read_bytes(), name
    assert "# me/tiny-grpo" in (pushed / "README.md").read_text()
    assert hub.requests == ["/api/repos/create", "/api/validate-yaml", "/api/models/me/tiny-grpo/preupload/main",
                            "/api/models/me/tiny-grpo/commit/main"]


def test_the_pushed_card_parses_and_holds_what_the_hub_reads(tmp_path, monkeypatch):
    """A LoRA run from a local base whose card names its hub base and license, on a local snapshot of a hub dataset,
    pushed: the card parses with huggingface_hub and carries base_model, datasets, license, library_name, metrics."""
    from huggingface_hub import ModelCard

    from tests.recipes.helpers import save_image, write_jsonl
    from vlm_grpo.adapters.registry import family_class

    base = tmp_path / "base"
    family_class("smolvlm").tiny(seed=0).save(base)
    (base / "README.md").write_text("---\nbase_model: someone/tiny-vlm\nlicense: apache-2.0\n---\n# a local copy\n")
    data = tmp_path / "cache" / "datasets--someone--colours" / "snapshots" / "0123abcd"  # huggingface_hub's layout
    for i in range(2):
        save_image(data / f"{i}.png", i)
    write_jsonl(data / "train.jsonl", [{"prompt": f"Colour of picture {i}?", "image": f"{i}.png"} for i in range(2)])
    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    try:
        assert main(["train", *RUN[2:11], *RUN[15:], "--model", str(base), "--dataset", str(data), "--reward",
                     "tests/grpo/toy_rewards.py:lowercase_share", "--lora.r", "4", "--batch-size", "2",
                     "--num-generations", "2", "--eval.size", "2", "--eval-batch-size", "2",
                     "--output-dir", str(tmp_path / "run"), "--push-to-hub", "--hub-model-id", "me/tiny-lora"]) == 0
        card = ModelCard.load(tmp_path / "hub" / "me" / "tiny-lora" / "README.md")
        card.validate()  # the hub's own check of the metadata block (here: the local stand-in's)
    finally:
        hub.close()
    after = json.loads((tmp_path / "run" / "eval-after.json").read_text())
    assert card.data.base_model == "someone/tiny-vlm" and card.data.license == "apache-2.0"
    assert card.data.datasets == ["someone/colours"] and card.data.library_name == "peft"
    assert card.data.base_model_relation == "adapter" and {"vlm-grpo", "grpo", "lora"} <= set(card.data.tags)
    metrics = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert metrics == pytest.approx({"reward": after["reward"], "rewards/lowercase_share": after["rewards"]["lowercase_share"]},
                                    abs=1e-6)
    assert {r.dataset_type for r in card.data.eval_results} == {"someone/colours"}
