"""The run every part shares: its settings, the accelerator (processes, device, mixed precision), the run
directory (locked by the main process while the run lives), metrics.jsonl, the trackers, and the history of
every step's metrics (checkpoints carry it)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from vlm_grpo.grpo.distributed.process_exit import release_group_at_exit
from vlm_grpo.grpo.distributed import fsdp, processes
from vlm_grpo.grpo.run import process_checks
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.run.logs import RunLog
from vlm_grpo.grpo.run.tracker_logging import RunTrackers
from vlm_grpo.grpo.safe_files import CreatedFiles
from vlm_grpo.grpo.run.tracker_setup import check_trackers
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.training.precision import accelerator_precision
from vlm_grpo.grpo.training.preflight import check_mixed_precision


def own_precision(mode: str) -> None:
    """accelerate keeps one AcceleratorState per process and refuses another precision after it: a run after a TRL
    trainer (or a run) of another precision in the same process would fail at its start. The run resets it, as
    transformers' TrainingArguments does for each trainer; the processes' group (PartialState) is kept."""
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision", mode) != mode:
        AcceleratorState._reset_state()


class RunContext:
    def __init__(self, cfg: TrainConfig, resume_hint: str = "--resume"):
        """Checks the trackers and precision, seeds, and locks the run directory (main process). `resume_hint`: how
        the one who started the run continues it, as messages after a stop or failure say it."""
        check_trackers(cfg.logging.report_to)
        self.resume_hint = resume_hint
        check_mixed_precision(cfg.mixed_precision, cfg.model.device)
        self.cfg = cfg
        own_precision(accelerator_precision(cfg))
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # lets torchrun-launched CPU processes form a gloo group
            mixed_precision=accelerator_precision(cfg),  # none where the weights themselves are stored in bf16
            log_with=cfg.logging.report_to or None,
            project_dir=cfg.logging.output_dir,
        )
        if self.accelerator.num_processes > 1:
            release_group_at_exit()
        set_seed(cfg.seed)
        if cfg.perf.full_determinism:  # TRL's full_determinism: transformers' own switch (seeds, deterministic kernels)
            from transformers import enable_full_determinism

            enable_full_determinism(cfg.seed)
        self.sharding = fsdp.requested_mode(cfg.fsdp, self.accelerator)  # "no", or how FSDP shards the policy
        if self.sharding != "no" and not torch.distributed.is_initialized():
            raise SettingError("fsdp", f"{self.sharding} shards across processes: launch with `accelerate launch "
                               "--num_processes N` (or torchrun); one process trains without fsdp")
        self.run_dir = Path(cfg.logging.output_dir)
        self.trackers = RunTrackers(self.accelerator, cfg, self.run_dir, self.is_main)
        self.log_history: list[dict[str, Any]] = []  # every step's metrics, for checkpoints and trainer_state.json
        self.lock = None  # the run directory's lock, held by the main process until the run ends
        if self.is_main:
            self.lock = prepare_run_dir(self.run_dir, resume=cfg.resume or cfg.resume_from is not None,
                                        overwrite=cfg.logging.overwrite_output_dir,
                                        keep_earlier=cfg.logging.keep_earlier_run)
        self.log: RunLog | None = None

    def open_log(self) -> RunLog:
        """metrics.jsonl and completions.jsonl, once every process sees the run directory."""
        process_checks.check_shared_run_dir(self.run_dir, self.accelerator, self.cfg.logging.shared_dir_timeout)
        self.log = RunLog(self.run_dir, enabled=self.is_main)
        return self.log

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def release_lock(self) -> None:
        if self.lock is not None:
            with contextlib.suppress(OSError, SettingError):  # what the run made meanwhile, recorded as its own
                CreatedFiles(self.run_dir).settle()
            self.lock.release()

    # ---------------------------------------------------------------- across processes
    def mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        return processes.mean_over_processes(self.accelerator, metrics)

    def extremes_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        return processes.extremes_over_processes(self.accelerator, metrics)

    def agreed_stop(self, signum: int | None) -> int:
        """The signal received by this process or any other (0: none): all stop at the same step, since saving is
        collective."""
        if self.accelerator.num_processes == 1:
            return signum or 0
        received = torch.tensor([signum or 0], device=self.accelerator.device)
        return int(self.accelerator.gather(received).max())

    def gather_rows(self, rows: list[dict]) -> list[dict]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)

    def gather_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """1-D tensors of any length from every process, concatenated."""
        if self.accelerator.num_processes == 1:
            return x
        sizes = self.accelerator.gather(torch.tensor([x.numel()], device=x.device))
        padded = self.accelerator.pad_across_processes(x, dim=0)
        gathered = self.accelerator.gather(padded).view(len(sizes), -1)
        return torch.cat([row[: int(n)] for row, n in zip(gathered, sizes)])
