"""Several machines, simulated on loopback: every machine is its own `accelerate launch --num_machines 2
--machine_rank R --main_process_ip 127.0.0.1` (or torchrun) with CPU processes over gloo, as on a cluster.

Default run: an FSDP run on two machines (gradient accumulation, a sharded reference) saves, dies, is resumed on one
machine with the same process count and ends bit-identical to the uninterrupted run, with a `final/` that
from_pretrained loads (each prompt's group generated on one process, every process's images saved by the main one);
a run directory that one machine does not share is refused at the start; a checkpoint resumed with another process
count is refused in one line; prompts follow the global rank.
`pytest -m multinode tests/grpo/test_multi_node.py` adds the full matrix (about 5 minutes on 2 busy cores): DDP and
FSDP on 2 machines x 1 process (run, checkpoint, resume) equal to 1 machine x 2 processes, and 2 machines x 2
processes under torchrun equal to 1 machine x 4 processes under accelerate.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tests.grpo.launches import (DDP, FAST, FSDP, accelerate_node, cli, free_port, on_machines, run_machines,
                                 succeeded, torchrun_node)
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.parts.training_data import TrainingData

# a dense reward: every group has a spread, so step 1 already moves the policy away from the reference
COMMON = ["train", "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--beta", "0.04", "--learning-rate", "1e-3",
          "--save-every", "1", "--data.rewards", "lower=tests.grpo.toy_rewards:lowercase_share", *FAST]
LAYOUTS = {"ddp": DDP, "fsdp": FSDP}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, unequal[:5]


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]


def die_after_checkpoint_1(run: Path) -> None:
    """What a run killed during step 2 leaves: checkpoint-1 and the logs (resume drops their later lines)."""
    shutil.rmtree(run / "checkpoint-2")
    shutil.rmtree(run / "final")


def assert_one_writer(run: Path, processes: int) -> None:
    """The main process wrote the logs once; under FSDP every process wrote its shard into the one directory."""
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert {r["process"] for r in read_jsonl(run / "completions.jsonl")} == set(range(processes))
    shards = run / "checkpoint-2" / "sharded"
    if shards.is_dir():
        assert sorted(p.name for p in shards.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(processes)]


def assert_groups_whole_and_images_saved(run: Path, generations: int) -> None:
    """Each prompt's group was generated on one process; every process's prompt images reached the main process,
    which saved them inside the run and wrote each step's parquet with their paths."""
    rows = read_jsonl(run / "completions.jsonl")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["step"], r["process"], r["sample_index"])].append(r)
    assert {process for _, process, _ in groups} == {0, 1}
    assert all(len(group) == generations for group in groups.values()), {k: len(g) for k, g in groups.items()}
    assert all(len(r["images"]) == 1 and (run / r["images"][0]).is_file() for r in rows)
    step2 = pq.read_table(run / "completions" / "completions_00002.parquet").to_pylist()
    assert [r["images"] for r in step2] == [r["images"] for r in rows if r["step"] == 2]


def test_fsdp_on_two_machines_resumes_exactly_on_one(tmp_path, capsys):
    """The policy and its reference copy sharded over 2 machines, gradient accumulation without reduce-scatter in
    between; the run dies after checkpoint-1 and is resumed on one machine with 2 processes (its shards read as plain
    data): it ends with exactly the weights and metrics of the uninterrupted run, and a plain `final/`."""
    run, args = tmp_path / "run", [*COMMON, "--gradient-accumulation-steps", "2"]
    on_machines(FSDP, 2, 1, lambda rank: cli(*args, "--output-dir", run))
    assert_one_writer(run, 2)
    assert_groups_whole_and_images_saved(run, generations=4)
    listed = json.loads((run / "checkpoint-2" / "manifest.json").read_text())["files"]
    assert {"sharded/__0_0.distcp", "sharded/__1_0.distcp", "sharded/.metadata"} <= set(listed)
    assert json.loads((run / "checkpoint-2" / "run_state.json").read_text())["fsdp"] == "full_shard"
    assert main(["verify", str(run)]) == 0
    straight, metrics = final_weights(run), read_jsonl(run / "metrics.jsonl")
    assert metrics[-1]["kl"] > 0  # the sharded reference copy took part

    die_after_checkpoint_1(run)  # ... and the run goes on from checkpoint-1 on one machine with 2 processes
    on_machines(FSDP, 1, 2, lambda rank: cli(*args, "--output-dir", run, "--resume"))
    assert_same_weights(straight, final_weights(run))
    assert without_times(read_jsonl(run / "metrics.jsonl")) == without_times(metrics)
    model = family_class("qwen2_5_vl").model_class.from_pretrained(run / "final")  # an ordinary checkpoint
    assert all(torch.equal(model.state_dict()[k], v) for k, v in straight.items() if k in model.state_dict())

    # one process cannot continue a 2-process run: refused in one line, nothing written
    before = sorted(p.name for p in run.iterdir())
    assert main([*args, "--output-dir", str(run), "--resume"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "checkpoint-2 was written by 2 processes under fsdp full_shard and this run has 1: resume it with 2" in error
    assert sorted(p.name for p in run.iterdir()) == before
    assert (run / "checkpoint-2" / "sharded").is_dir()


def test_a_run_directory_one_machine_does_not_share_is_refused_at_the_start(tmp_path):
    """Machine 1 is given its own output directory, as a node-local disk would be: every process stops before a
    model loads with one line naming the process that cannot see the main process's directory."""
    port = free_port()
    dirs = [tmp_path / "machine0" / "run", tmp_path / "machine1" / "run"]
    done = run_machines([accelerate_node(DDP, 2, r, 1, port) + cli(
        "train", "--model", "tiny:qwen2_5_vl", "--output-dir", dirs[r], "--logging.shared_dir_timeout", "1", *FAST)
        for r in range(2)])
    for rank, result in enumerate(done):  # each machine names the output_dir it was given
        assert result.returncode != 0
        lines = [line for line in result.stderr.splitlines() if "vlm-grpo train: error:" in line]
        assert lines, result.stderr[-3000:]
        assert f"{dirs[rank]} is not one directory for every process: process 1 (on " in lines[0]
        assert "did not see the file the main process" in lines[0]
    # the check's own file is gone; the run stopped before config.yaml: only the lock file of the refused start and its
    # (empty) list of created files are left
    assert sorted(p.name for p in dirs[0].iterdir()) == [".run.lock", ".vlm-grpo-files.json"]
    assert not json.loads((dirs[0] / ".vlm-grpo-files.json").read_text())["files"]
    assert not dirs[1].exists()  # nothing was written on machine 1


class _Rows(list):
    """A sample source whose every row is good: `pick` gives the row asked for."""

    def pick(self, index: int) -> tuple[int, int]:
        return index, self[index]


@pytest.mark.parametrize("step", range(4))
def test_prompts_follow_the_global_rank(step):
    """2 machines x 2 processes draw the prompts 1 machine x 4 processes draw: a process's prompts are a function
    of its global rank, not of its rank on its machine."""
    def drawn(rank: int, local: int) -> list[int]:
        acc = SimpleNamespace(process_index=rank, local_process_index=local, num_processes=4)
        data = TrainingData.__new__(TrainingData)  # the batch order alone: no recipe, no model
        data.ctx, data.dataset = SimpleNamespace(accelerator=acc), _Rows(range(100))
        data.cfg = SimpleNamespace(data=SimpleNamespace(batch_size=3, data_seed=None, shuffle=True, order="reseeded"), seed=5)
        batch = data.batch(step)
        assert batch.samples == batch.rows
        return batch.rows

    one_by_four = [drawn(rank, local=rank) for rank in range(4)]
    two_by_two = [drawn(2 * machine + local, local) for machine in range(2) for local in range(2)]
    assert two_by_two == one_by_four
    assert len({i for rows in one_by_four for i in rows}) == 12  # no prompt drawn twice in a step


@pytest.mark.multinode
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_two_machines_match_one(tmp_path, layout):
    """2 steps, checkpoint, resume on 2 machines x 1 process: the weights 1 machine x 2 processes end with."""
    kind, one, two = LAYOUTS[layout], tmp_path / "one", tmp_path / "two"
    on_machines(kind, 1, 2, lambda rank: cli(*COMMON, "--output-dir", one))
    on_machines(kind, 2, 1, lambda rank: cli(*COMMON, "--output-dir", two))
    assert_one_writer(two, 2)
    assert (two / "checkpoint-2" / "sharded").is_dir() == (layout == "fsdp")
    die_after_checkpoint_1(two)
    on_machines(kind, 2, 1, lambda rank: cli(*COMMON, "--output-dir", two, "--resume"))
    assert_same_weights(final_weights(one), final_weights(two))
    assert without_times(read_jsonl(one / "metrics.jsonl")) == without_times(read_jsonl(two / "metrics.jsonl"))
    assert read_jsonl(one / "completions.jsonl") == read_jsonl(two / "completions.jsonl")
    assert main([*COMMON, "--output-dir", str(two), "--resume"]) == 2  # with 1 process: refused


@pytest.mark.multinode
def test_two_by_two_under_torchrun_sees_what_one_by_four_sees(tmp_path):
    """The same prompts, completions and final weights from 2 machines x 2 processes (torchrun, as README shows it)
    as from 1 machine x 4 processes (accelerate launch)."""
    args = ["train", "--model", "tiny:qwen2_5_vl", "--max-steps", "2", "--learning-rate", "1e-3", *FAST]
    four, grid = tmp_path / "four", tmp_path / "grid"
    on_machines(DDP, 1, 4, lambda rank: cli(*args, "--output-dir", four))
    port = free_port()
    succeeded(run_machines([torchrun_node(2, r, 2, port) + cli(*args, "--output-dir", grid) for r in range(2)]))
    rows = read_jsonl(grid / "completions.jsonl")
    assert {r["process"] for r in rows} == {0, 1, 2, 3}
    assert rows == read_jsonl(four / "completions.jsonl")
    assert_same_weights(final_weights(four), final_weights(grid))
