"""A resource that runs out (ulimit -f, -v, -n, memory, a full disk) ends in one line naming it and its limit, exit 1,
with the last complete checkpoint kept and no temporary folder left."""

from __future__ import annotations

import contextlib
import errno
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.reliability.test_faults import _env
from tests.reliability.test_run_dir_links import snapshot
from vlm_grpo import resource_limits
from vlm_grpo.cli import main
from vlm_grpo.commands import families
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.safe_files import CreatedFiles
from vlm_grpo.grpo.training import preflight
from vlm_grpo.resource_limits import ResourceLimitReached, size_pair, size_text


class _TorchModel(torch.nn.Linear):
    """Weights written by torch.save's zip writer, which names no errno when a write fails."""

    def save_pretrained(self, out, **_):
        torch.save(self.state_dict(), Path(out) / "weights.pt")


class _SafetensorsModel(torch.nn.Linear):
    """Weights written by safetensors, whose Rust writer says `(os error 27)`."""

    def save_pretrained(self, out, **_):
        save_file(self.state_dict(), str(Path(out) / "model.safetensors"))


class _Processor:
    def save_pretrained(self, out):
        (Path(out) / "processor.json").write_text("{}")


class _Adapter:
    def __init__(self, model):
        self.model, self.processor = model, _Processor()


def _save(run: Path, step: int, adapter) -> Path:
    optimizer = torch.optim.AdamW(adapter.model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return ckpt.save_checkpoint(run, step, adapter, optimizer, scheduler, {"config": {}})


@contextlib.contextmanager
def file_size_limit(limit: int):
    """RLIMIT_FSIZE lowered for the block (Python ignores SIGXFSZ: a write past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _run_with_checkpoint_1(tmp_path: Path, model_class) -> tuple[Path, Path]:
    run = tmp_path / "run"
    prepare_run_dir(run, resume=False, overwrite=False).release()
    return run, _save(run, 1, _Adapter(model_class(4, 4)))


@pytest.mark.parametrize("model_class", [_TorchModel, _SafetensorsModel])
def test_a_save_past_the_file_size_limit_names_it_and_keeps_the_last_checkpoint(model_class, tmp_path):
    run, first = _run_with_checkpoint_1(tmp_path, model_class)
    before = snapshot(first)
    with file_size_limit(4096), pytest.raises(ResourceLimitReached) as refused:
        _save(run, 2, _Adapter(model_class(64, 64)))  # 16 KB of weights
    message = str(refused.value)
    assert message.startswith(f"file-size limit (ulimit -f) reached writing {run / '.tmp-checkpoint-2-'}"), message
    assert "no file may be larger than 4.1 KB" in message
    assert "previous checkpoint is kept as it was (checkpoint-1)" in message
    assert "ulimit -f unlimited" in message and "\n" not in message and "disk full" not in message
    assert not list(run.glob(".tmp-*")) and CreatedFiles(run).names() == {"checkpoint-1"}
    assert snapshot(first) == before and not ckpt.verify(first) and ckpt.latest_good_checkpoint(run) == first
    model = _TorchModel(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    assert ckpt.load_training_state(first, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))[
        "step"] == 1  # the last checkpoint still loads


def test_the_file_size_limit_during_a_command_exits_1_in_one_line(tmp_path, monkeypatch, capsys):
    run, first = _run_with_checkpoint_1(tmp_path, _TorchModel)

    def save_past_the_limit(_args):
        with file_size_limit(4096):
            _save(run, 2, _Adapter(_TorchModel(64, 64)))
        return 0

    monkeypatch.setattr(families, "run", save_past_the_limit)
    assert main(["families"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vlm-grpo families: error: file-size limit (ulimit -f) reached writing ") and \
        err.count("\n") == 1 and "Traceback" not in err
    assert [p.name for p in run.glob("checkpoint-*")] == ["checkpoint-1"] and not list(run.glob(".tmp-*"))


def _cli_under(limit: int, kind: int, command: str = "", args=("families",)) -> subprocess.CompletedProcess:
    """`vlm-grpo ARGS` in a child under resource `kind`'s soft limit; `command`: Python run as the families command."""
    code = ("import sys\nfrom vlm_grpo.commands import families\n"
            + (f"def run(_args):\n{command}\nfamilies.run = run\n" if command else "")
            + "from vlm_grpo.cli import main\nsys.exit(main(sys.argv[1:]))")
    hard = resource.getrlimit(kind)[1]
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=60,
                          preexec_fn=lambda: resource.setrlimit(kind, (limit, hard)))


def test_an_import_under_the_address_space_limit_names_the_limit_and_what_the_process_had():
    done = _cli_under(200 * 10**6, resource.RLIMIT_AS)  # torch's libraries cannot be mapped in 200 MB
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert re.match(r"vlm-grpo families: error: address-space limit \(ulimit -v\) of 200\.0 MB reached loading "
                    r"\S+\.so; the process had [0-9.]+ MB mapped; raise it \(ulimit -v unlimited", done.stderr)


def test_memory_error_under_the_address_space_limit_is_one_line():
    done = _cli_under(10**9, resource.RLIMIT_AS, "    bytearray(2 * 10**9)")
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert re.match(r"vlm-grpo families: error: address-space limit \(ulimit -v\) of 1\.00 GB reached; the process "
                    r"had [0-9.]+ MB mapped", done.stderr)


def test_the_open_file_limit_names_it_the_file_and_the_count(tmp_path):
    target = tmp_path / "notes.txt"
    fill = ("    import os, resource\n    from vlm_grpo.grpo import safe_files\n    held = []\n"
            "    while True:\n        try:\n            held.append(os.open('/dev/null', os.O_RDONLY))\n"
            "        except OSError:\n            break\n"
            f"    safe_files.write_file(safe_files.Path({str(target)!r}), 'x')\n")
    done = _cli_under(64, resource.RLIMIT_NOFILE, fill)
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"vlm-grpo families: error: open-file limit (ulimit -n) reached opening {target}: "
                                  "the process may hold 64 open files and holds 64; raise it (ulimit -n"), done.stderr
    assert not target.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("error, code, words", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/run/x"), errno.ENOSPC, "disk full writing /data/run/x, "),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/data/run/x"), errno.EDQUOT,
     "disk quota exceeded writing /data/run/x"),
    (OSError(errno.ENFILE, "Too many open files in system"), errno.ENFILE, "the system's open-file table is full"),
    (RuntimeError("Error while serializing: I/O error: File too large (os error 27)"), errno.EFBIG,
     "file-size limit (ulimit -f) reached: no file may be larger than 1.0 MB"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"), errno.ENOMEM,
     "; the process had "),
    (MemoryError(), errno.ENOMEM, "; the process had "),
])
def test_each_resource_that_ran_out_has_its_line(error, code, words):
    with file_size_limit(10**6):
        assert resource_limits.cause(error) == (error, code)
        line = resource_limits.explain(error)
        assert words in line and "\n" not in line, line
        try:  # a wrapping error keeps its own words and adds the resource's
            raise RuntimeError("reward 'r' failed") from error
        except RuntimeError as wrapped:
            assert resource_limits.explain(wrapped).startswith(f"reward 'r' failed; {line[:20]}")
    assert resource_limits.explain(ValueError("data.batch_size must be positive")) is None
    assert resource_limits.explain(OSError(errno.ENOENT, "No such file or directory")) is None


def test_sizes_are_written_in_a_unit_that_shows_them():
    assert [size_text(n) for n in (0, 999, 1024, 12_000_000, 3_250_000_000)] == \
        ["0 bytes", "999 bytes", "1.0 KB", "12.0 MB", "3.25 GB"]
    assert size_pair(12_000_000, 53_000_000_000) == ("12.0 MB", "53000.0 MB")  # the unit of the smaller
    assert size_pair(1001, 1000) == ("1001 bytes", "1000 bytes")  # never two equal texts for two sizes


def test_the_disk_check_writes_tiny_sizes_and_refuses_only_when_more_is_needed_than_is_free(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 4)  # 20 float32 weights (80 bytes) + Adam's two moments (160): 240 bytes
    for free in (100, 239):
        monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _p, free=free: type("Usage", (), {"free": free})())
        with pytest.raises(ResourceLimitReached) as refused:
            preflight.check_disk_space(tmp_path, model)
        assert str(refused.value) == (f"{tmp_path}: a checkpoint needs about 240 bytes but only {free} bytes are free; "
                                      "free some space, or choose another --output-dir")
    for free in (240, 241):  # the old check's 20% margin refused these
        monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _p, free=free: type("Usage", (), {"free": free})())
        preflight.check_disk_space(tmp_path, model)
