"""A benchmark run: build the model once, run each framework, report per-framework medians and ratios."""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.bench.measure import FrameworkResult, describe_device, versions
from vlm_grpo.bench.runners import build_source, check_frameworks, run_trl, run_vlm_grpo
from vlm_grpo.bench.settings import DEFAULT_THREADS, BenchSettings, precision_on


def run_benchmark(settings: BenchSettings) -> dict[str, Any]:
    check_frameworks(settings)
    device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads = settings.threads or DEFAULT_THREADS.get(settings.model, 1)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    results: dict[str, FrameworkResult] = {}
    with tempfile.TemporaryDirectory(prefix="vlm-grpo-bench-") as tmp:
        work = Path(tmp)
        source = build_source(settings, work / "model")
        runners = {"vlm-grpo": run_vlm_grpo, "trl": run_trl}
        for name in settings.frameworks:
            torch.manual_seed(settings.seed)
            results[name] = runners[name](settings, source, device, work)
    report = {
        "settings": asdict(settings),
        "device": describe_device(device, threads),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "precision": precision_on(settings, device),
        "results": {k: v.summary() for k, v in results.items()},
    }
    if "vlm-grpo" in results and "trl" in results:
        ours, theirs = results["vlm-grpo"], results["trl"]
        report["ratios"] = {
            "step_throughput (trl step time / vlm-grpo step time)": theirs.step_time / ours.step_time,
            "rollout_tokens_per_s (vlm-grpo / trl)": ours.rollout_tokens_per_s / theirs.rollout_tokens_per_s,
            "peak_memory (vlm-grpo / trl)": ours.peak_memory_bytes / max(1, theirs.peak_memory_bytes),
        }
    return report


def _lengths_said(lengths: str) -> str:
    return "fixed" if lengths == "fixed" else f"lengths drawn {lengths}"


def _dataset_said(s: dict[str, Any]) -> str:
    """How many prompts the data holds, and whether the measured steps see prompts again (a later epoch's case)."""
    seen = s["batch_size"] * (s["warmup"] + s["steps"])
    prompts = s.get("prompts") or max(64, seen)
    return f"{prompts} prompts" + (f" ({seen} drawn: later steps see them again)" if seen > prompts else
                                   " (every step new ones)")


def format_report(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        (
            f"model {s['model']}: B={s['batch_size']} G={s['num_generations']} T={s['max_new_tokens']} "
            f"({_lengths_said(s.get('lengths', 'fixed'))}), "
            f"beta={s['beta']} loss={s['loss_type']} ({s['importance_sampling_level']} level) "
            f"{s.get('images_per_prompt', 1)} image(s) of {s['image_size']} px per prompt, "
            f"{_dataset_said(s)}, "
            f"{'QLoRA (4-bit base), ' if s.get('load_in_4bit') else ''}"
            f"{'LoRA r=' + str(s['lora_r']) + ', ' if s.get('lora_r') else ''}"
            f"{s['steps']} measured step(s) after {s['warmup']} warm-up, "
            f"rollouts by {'vLLM (colocate)' if s.get('engine') == 'vllm' else 'generate()'}"
        ),
        f"device: {report['device']}; precision: {report.get('precision', '?')} in both frameworks",
        "",
        "| framework | step time (s) | rollout (s) | rollout tokens/s | vision calls/step | images encoded/step | peak memory (MiB) "
        "| step CPU time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['step_time_s']:.2f} | {r['rollout_time_s']:.2f} | {r['rollout_tokens_per_s']:.0f} | "
            f"{r['vision_calls_per_step']} | {r['vision_images_per_step']} | {r['peak_memory_mib']:.0f} | "
            f"{r['step_cpu_time_s']:.2f} |"
        )
    for name, r in report["results"].items():
        if r.get("mean_completion_length") is not None:
            lines.append(f"\n{name}: completions ended at drawn lengths, mean {r['mean_completion_length']:.1f} "
                         f"tokens over the measured steps")
    phased = {name: r["phases_s"] for name, r in report["results"].items() if r.get("phases_s")}
    if phased:
        names = list(phased)
        lines += ["", "where a step's time goes (median seconds per step; bench/phases.py):", "",
                  "| phase | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for phase in next(iter(phased.values())):
            lines.append(f"| {phase} | " + " | ".join(f"{phased[n].get(phase, 0.0):.3f}" for n in names) + " |")
    for name, r in report["results"].items():
        if "parts" in r:
            parts = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.3f} s" for k, v in r["parts"].items()
                              if k.endswith("_s"))
            lines.append(f"\n{name}, where the time went (medians per step; engine start once): {parts}")
    pre = {name: r["preprocessing_s_per_step"] for name, r in report["results"].items()
           if r.get("preprocessing_s_per_step")}
    if pre:
        lines.append("\npreprocessing per measured step (s): " + "; ".join(
            f"{name} " + ", ".join(f"{t:.4f}" for t in times) for name, times in pre.items()))
    for name, r in report["results"].items():
        if r.get("prompt_cache"):
            c = r["prompt_cache"]
            lines.append(f"\n{name} prompt cache over the measured steps: {c['hits']} hits, {c['misses']} misses "
                         f"({c['rows']} rows, {c['bytes'] / 2**20:.1f} MiB kept)")
    for key, value in report.get("ratios", {}).items():
        lines.append(f"\n{key}: {value:.2f}x")
    return "\n".join(lines)
