"""Safe loading: pickled weights and remote code are refused unless asked for, and resuming never unpickles code:
a checkpoint file that is not plain data is refused in one line naming it (its code never runs), unless the user
trusts that checkpoint with --trust-checkpoint."""

from __future__ import annotations

import io
import pickle
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.hostile_files import Payload, plant
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.cli import main
from vlm_grpo.grpo.checkpoint import sharded as shards
from vlm_grpo.grpo.checkpoint.manifest import write_manifest
from vlm_grpo.grpo.safe_loading import TRUST_HINT, UnsafeCheckpointFile, load_state_file
from vlm_grpo.loader import load_model

RUN = ["train", "--model", "tiny:qwen2_5_vl", "--learning-rate", "1e-3", "--data.recipe_options", "{image_size: 56}",
       "--max-new-tokens", "6", "--logging.progress", "false", "--log-completions", "false", "--max-steps", "2",
       "--save-every", "1"]


@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_the_planted_file_would_run_code_and_the_safe_reader_refuses_it(tmp_path, form):
    control, marker = tmp_path / "control", tmp_path / "marker"
    plant(tmp_path / "x.pt", control, form)
    # the control: a full unpickling runs the payload
    if form == "torch.save":
        torch.load(tmp_path / "x.pt", weights_only=False)
    else:
        pickle.loads((tmp_path / "x.pt").read_bytes())
    assert control.read_text() == "ran"
    plant(tmp_path / "x.pt", marker, form)
    with pytest.raises(UnsafeCheckpointFile) as err:
        load_state_file(tmp_path / "x.pt")
    assert str(err.value).startswith(f"{tmp_path / 'x.pt'} is not plain data (")
    assert "\n" not in str(err.value) and "--trust-checkpoint" in str(err.value)
    assert not marker.exists()


def error_lines(stderr: str) -> list[str]:
    """The CLI's error messages in `stderr`, each checked to be whole on its line (ending with the trust hint)."""
    lines = [line for line in stderr.splitlines() if line.startswith("vlm-grpo train: error:")]
    assert all(line.endswith(TRUST_HINT) for line in lines), lines
    return lines


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A 2-step run with checkpoint-1, checkpoint-2 and final/."""
    run = tmp_path_factory.mktemp("straight")
    assert main([*RUN, "--output-dir", str(run)]) == 0
    return run


@pytest.mark.parametrize("name, form", [("optimizer.pt", "torch.save"), ("scheduler.pt", "pickle"),
                                        ("rng_state.pt", "torch.save")])
def test_resume_refuses_a_planted_pickle_in_one_line_and_runs_none_of_it(straight, tmp_path, capsys, name, form):
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(straight, run)
    plant(run / "checkpoint-2" / name, marker, form)
    write_manifest(run / "checkpoint-2")  # whoever writes a file can write its manifest too
    metrics = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main([*RUN, "--output-dir", str(run), "--resume"]) == 1  # failed (not a bad setting), in one line
    [err] = error_lines(capsys.readouterr().err)
    assert err.startswith(f"vlm-grpo train: error: {run / 'checkpoint-2' / name} is not plain data (")
    assert not marker.exists()
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing the run had done is lost


def test_a_trusted_checkpoint_the_safe_reader_refuses_resumes_exactly_with_trust_checkpoint(straight, tmp_path, capsys):
    """checkpoint-1 as a trusted older writer left it, its RNG file holding a numpy array (as other trainers' do):
    refused without the flag, resumed with it to exactly the uninterrupted run's weights; what the resumed run
    writes is plain data again, and the trust is not written into the run's config."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "checkpoint-2")
    shutil.rmtree(run / "final")
    rng = run / "checkpoint-1" / "rng_state.pt"
    torch.save({**torch.load(rng, weights_only=True), "numpy": np.random.get_state()}, rng)
    write_manifest(run / "checkpoint-1")
    capsys.readouterr()
    assert main([*RUN, "--output-dir", str(run), "--resume"]) == 1  # failed (not a bad setting), in one line
    [err] = error_lines(capsys.readouterr().err)
    assert f"{rng} is not plain data (it names numpy" in err

    assert main([*RUN, "--output-dir", str(run), "--resume", "--trust-checkpoint"]) == 0
    assert "resumed from" in capsys.readouterr().out
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pt"):  # the run's own checkpoints: plain data
        load_state_file(run / "checkpoint-2" / name)
    assert "trust_checkpoint" not in (run / "config.yaml").read_text()


# ------------------------------------------------------------------ sharded (DCP) checkpoints, one process
def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    groups = [{"params": model[0].parameters(), "name": "first"}, {"params": model[1].parameters(), "name": "last"}]
    return model, torch.optim.AdamW(groups, lr=0.01)


@pytest.fixture
def sharded(tmp_path):
    """A DCP checkpoint of a model and its AdamW state after one step, written by `write_shards`."""
    model, optimizer = _model_and_optimizer()
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    shards.write_shards(tmp_path, model, optimizer)
    return tmp_path, model, optimizer


def test_shards_are_read_back_as_plain_data(sharded):
    path, model, optimizer = sharded
    fresh, fresh_optimizer = _model_and_optimizer()
    fresh_optimizer.param_groups[1]["lr"] = 0.5  # a hyperparameter the shards' non-tensor items must restore
    shards.read_shards(path, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    saved, read = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert read["param_groups"] == saved["param_groups"]
    assert all(torch.equal(saved["state"][k][n], read["state"][k][n]) for k in saved["state"] for n in saved["state"][k])
    trusted, trusted_optimizer = _model_and_optimizer()  # --trust-checkpoint: DCP's own reader, the same result
    shards.read_shards(path, trusted, trusted_optimizer, trust=True)
    assert trusted_optimizer.state_dict()["param_groups"] == saved["param_groups"]


def test_a_planted_dcp_metadata_or_item_is_refused_and_runs_none_of_it(sharded, tmp_path):
    path, model, optimizer = sharded
    marker = tmp_path / "marker"
    metadata = path / shards.SHARDS_DIR / shards.METADATA_FILE
    plant(metadata, marker, "pickle")
    with pytest.raises(UnsafeCheckpointFile, match=rf"^{metadata} is not plain data \(it names builtins.exec\)"):
        shards.read_shards(path, *_model_and_optimizer())

    # a non-tensor item (an optimizer hyperparameter) that calls exec, inside a shard file DCP wrote itself
    state = shards._state(model, optimizer)
    state["optimizer"]["param_groups"][0]["lr"] = Payload(marker)
    shutil.rmtree(path / shards.SHARDS_DIR)
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(path / shards.SHARDS_DIR))
    with pytest.raises(UnsafeCheckpointFile, match=r"__0_0.distcp \(item optimizer.param_groups.*lr\) is not plain"):
        shards.read_shards(path, *_model_and_optimizer())
    assert not marker.exists()


def test_dcp_metadata_may_only_point_at_its_own_shard_files(sharded):
    path, _, _ = sharded
    metadata = path / shards.SHARDS_DIR / shards.METADATA_FILE
    record = pickle.loads(metadata.read_bytes())  # our own file: a full unpickling is safe here
    info = next(iter(record.storage_data.values()))
    info.relative_path = "../../elsewhere.distcp"
    metadata.write_bytes(pickle.dumps(record))
    with pytest.raises(UnsafeCheckpointFile, match="it points at '../../elsewhere.distcp', not a shard file"):
        shards.read_shards(path, *_model_and_optimizer())


# protocol-0 pickles: another class; a BUILD that would set an attribute on an allowed class itself (a global change)
FOREIGN = pickle.dumps(io.BytesIO(b"x"))
CLASS_BUILD = b"ctorch.distributed.checkpoint.metadata\nMetadata\n(N}Vinjected\nI1\nstb."


@pytest.mark.parametrize("data, reason", [(FOREIGN, "it names _io.BytesIO"),
                                          (CLASS_BUILD, "it sets the state of type <class 'torch.distributed")])
def test_the_metadata_reader_builds_records_and_changes_nothing_else(tmp_path, data, reason):
    from torch.distributed.checkpoint.metadata import Metadata

    from vlm_grpo.grpo.safe_loading import load_records

    (tmp_path / "m").write_bytes(data)
    with pytest.raises(UnsafeCheckpointFile, match=re.escape(reason)):
        load_records(tmp_path / "m", shards.METADATA_NAMES, Metadata)
    assert not hasattr(Metadata, "injected")


# ------------------------------------------------------------------ weights and remote code
def test_pickled_weights_refused_unless_allowed(tmp_path):
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    adapter.processor.save_pretrained(tmp_path)
    adapter.model.config.save_pretrained(tmp_path)
    torch.save(adapter.model.state_dict(), tmp_path / "pytorch_model.bin")  # a pickle-only checkpoint
    with pytest.raises(OSError, match="safetensors|model.safetensors"):
        load_model(f"qwen2_5_vl:{tmp_path}")
    loaded = load_model(f"qwen2_5_vl:{tmp_path}", allow_pickle_weights=True)
    assert loaded.model.config.model_type == "qwen2_5_vl"


def test_remote_code_is_off_by_default(tmp_path, monkeypatch):
    seen = {}
    cls = family_class("qwen2_5_vl")

    def fake(path, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cls.model_class, "from_pretrained", fake)
    with pytest.raises(RuntimeError, match="stop here"):
        cls.load(str(tmp_path))
    assert seen["trust_remote_code"] is False and seen["use_safetensors"] is True
