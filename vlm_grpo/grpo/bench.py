"""GRPO step benchmark: the same model, data and settings through vlm-grpo and through TRL 1.16's GRPOTrainer.

Both runs start from the same saved weights (TRL reloads its reference model from that directory when
beta > 0), draw prompts from the same recipe, sample fixed-length completions (EOS ignored:
min_new_tokens = max_new_tokens) with the same suppressed ids, and use the same loss type, beta,
learning rate and trainable set. Measured per framework, after warm-up steps: step time, rollout
time and rollout tokens/s (completion tokens / rollout seconds), vision-encoder calls and images per
step (a forward pre-hook on the vision tower), and peak memory (process RSS sampled on CPU,
torch.cuda.max_memory_allocated on GPU).

CPU twins (`bench:NAME`, a few million parameters, 224-px images -> 64 image tokens):
- `qwen_small`: a small Qwen2.5-VL (ViT 4 x 192 -> LM 4 x 256);
- `hybrid_vit_heavy`: the ViT-heavy hybrid (Qwen ViT 8 x 256 feeding a 2-layer, 128-wide LM).
GPU: the real-size random-weight presets (`preset:qwen2_5_vl_3b`, `preset:hybrid_3b_vit_0_5b`,
`preset:smolvlm_256m`), fp32 master weights with bf16 autocast in both frameworks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import platform
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.grpo.counters import VisionCounter

FRAMEWORKS = ("vlm-grpo", "trl")
BENCH_PIXELS = (224 * 224, 224 * 224)  # a 224 x 224 image -> 16 x 16 patches -> 8 x 8 = 64 merged tokens


def _qwen_small(seed: int = 0, dtype: torch.dtype = torch.float32):
    from vlm_grpo.adapters.registry import family_class

    return family_class("qwen2_5_vl").preset("qwen2_5_vl_small", seed=seed, dtype=dtype)


def _hybrid_vit_heavy(seed: int = 0, dtype: torch.dtype = torch.float32):
    from vlm_grpo.adapters.registry import family_class

    return family_class("hybrid").preset("hybrid_vit_heavy", seed=seed, dtype=dtype)


BENCH_TWINS = {"qwen_small": _qwen_small, "hybrid_vit_heavy": _hybrid_vit_heavy}
DEFAULT_THREADS = {"qwen_small": 2, "hybrid_vit_heavy": 1}


@dataclass
class BenchSettings:
    model: str = "bench:qwen_small"  # bench:NAME (CPU twins) | preset:NAME (GPU) | anything load_adapter takes
    batch_size: int = 4  # prompts per step (B)
    num_generations: int = 8  # completions per prompt (G)
    max_new_tokens: int = 64  # every completion has exactly this many tokens (EOS ignored)
    beta: float = 0.04
    loss_type: str = "dapo"
    learning_rate: float = 1e-5
    image_size: int = 224
    steps: int = 3  # measured steps per framework
    warmup: int = 1  # steps run first and not measured (cache probe, allocator warm-up)
    threads: int | None = None  # torch intra-op threads on CPU (None: the twin's default, else 1)
    seed: int = 0
    frameworks: tuple[str, ...] = FRAMEWORKS
    freeze: tuple[str, ...] = ()  # module groups frozen in both frameworks
    shared_prefix: bool = True  # vlm-grpo's sharing switches (off: the plain path, for ablations)
    share_image_features: bool = True
    device: str | None = None  # default: cuda if available, else cpu


@dataclass
class FrameworkResult:
    framework: str
    step_times: list[float] = field(default_factory=list)
    rollout_times: list[float] = field(default_factory=list)
    vision_calls: list[int] = field(default_factory=list)
    vision_images: list[int] = field(default_factory=list)
    peak_memory_bytes: int = 0
    memory_kind: str = ""
    completion_tokens_per_step: int = 0

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
            "rollout_tokens_per_s": self.rollout_tokens_per_s,
            "vision_calls_per_step": statistics.median(self.vision_calls) if self.vision_calls else None,
            "vision_images_per_step": statistics.median(self.vision_images) if self.vision_images else None,
            "peak_memory_mib": self.peak_memory_bytes / 2**20,
            "memory_kind": self.memory_kind,
            "step_times_s": self.step_times,
            "rollout_times_s": self.rollout_times,
        }


# ---------------------------------------------------------------- measurement helpers
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def letter_share(completions, **_) -> list[float]:
    """A cheap, varying reward used by both frameworks: the share of ASCII letters in the completion."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(1, len(t)) for t in texts]


# ---------------------------------------------------------------- model source
def build_source(settings: BenchSettings, out_dir: Path):
    """Build the benchmark model once and save it (weights + processor); both frameworks load this copy."""
    kind, _, name = settings.model.partition(":")
    if kind == "bench":
        if name not in BENCH_TWINS:
            raise ValueError(f"unknown bench twin {name!r}; known: {', '.join(sorted(BENCH_TWINS))}")
        adapter = BENCH_TWINS[name](seed=settings.seed, dtype=torch.float32)
    elif kind == "preset":
        from vlm_grpo.adapters.registry import all_presets

        presets = all_presets()
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(presets))}")
        adapter = presets[name].preset(name, seed=settings.seed, dtype=torch.float32)  # fp32 master weights
    else:
        from vlm_grpo.loader import load_model

        adapter = load_model(settings.model, dtype=torch.float32, device="cpu", decide_cache=False)
    adapter.save(out_dir)
    return type(adapter)


def _load(adapter_cls, path: Path, device: torch.device):
    adapter = adapter_cls.load(str(path), dtype=torch.float32)
    adapter.model.to(device)
    return adapter


def _freeze(adapter, groups: tuple[str, ...]) -> None:
    names = adapter.module_groups()
    params = dict(adapter.model.named_parameters())
    for group in groups:
        for name in names[group]:
            params[name].requires_grad_(False)


def _samples(settings: BenchSettings, count: int):
    from vlm_grpo.recipes import get_recipe

    dataset = get_recipe("shapes").build(split="train", size=count, seed=settings.seed, image_size=settings.image_size)
    return [dataset[i] for i in range(count)]


# ---------------------------------------------------------------- the two runs
def run_vlm_grpo(settings: BenchSettings, adapter_cls, source: Path, device: torch.device, work: Path) -> FrameworkResult:
    from vlm_grpo.grpo.config import load_config
    from vlm_grpo.grpo.trainer import GRPOTrainer

    adapter = _load(adapter_cls, source, device)
    total = settings.warmup + settings.steps
    overrides = [
        "--model", str(source), "--recipe", "shapes", "--data.recipe_options", json.dumps({"image_size": settings.image_size}),
        "--train-size", str(max(64, settings.batch_size * total)), "--batch-size", str(settings.batch_size),
        "--num-generations", str(settings.num_generations), "--max-new-tokens", str(settings.max_new_tokens),
        "--min-new-tokens", str(settings.max_new_tokens), "--beta", str(settings.beta), "--loss-type", settings.loss_type,
        "--learning-rate", str(settings.learning_rate), "--max-steps", str(total), "--seed", str(settings.seed),
        "--output-dir", str(work / "vlm-grpo"), "--log-completions", "false", "--progress", "false",
        "--data.rewards", "letters=vlm_grpo.grpo.bench:letter_share",
        "--shared-prefix", str(settings.shared_prefix).lower(),
        "--share-image-features", str(settings.share_image_features).lower(),
        "--mixed-precision", "bf16" if device.type == "cuda" else "no",
    ]
    if settings.freeze:
        overrides += ["--optim.freeze", ",".join(settings.freeze)]
    cfg = load_config(overrides=overrides)
    with contextlib.redirect_stdout(None):  # the trainable-parameter table
        trainer = GRPOTrainer(cfg, adapter=adapter)
    result = FrameworkResult("vlm-grpo", completion_tokens_per_step=settings.batch_size * settings.num_generations * settings.max_new_tokens)
    for step in range(settings.warmup):
        trainer.train_step(step)
    with PeakMemory(device) as memory:
        for step in range(settings.warmup, total):
            _sync(device)
            started = time.perf_counter()
            metrics = trainer.train_step(step)
            _sync(device)
            result.step_times.append(time.perf_counter() - started)
            result.rollout_times.append(trainer.timings["rollout"])
            result.vision_calls.append(int(metrics["perf/vision_calls"]))
            result.vision_images.append(int(metrics["perf/vision_images"]))
    result.peak_memory_bytes, result.memory_kind = memory.peak, memory.kind
    trainer.vision_counter.close()
    del trainer, adapter
    gc.collect()
    return result


def run_trl(settings: BenchSettings, adapter_cls, source: Path, device: torch.device, work: Path) -> FrameworkResult:
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    adapter = _load(adapter_cls, source, device)
    adapter.tokenizer.padding_side = "left"  # right padding silently corrupts M-RoPE positions in TRL 1.16
    _freeze(adapter, settings.freeze)
    total = settings.warmup + settings.steps
    samples = _samples(settings, max(64, settings.batch_size * total))
    if any(len(s.images) != 1 for s in samples):
        raise ValueError("the TRL run expects exactly one image per prompt")
    data = datasets.Dataset.from_list([{"prompt": s.prompt, "image": s.images[0]} for s in samples])
    args = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=settings.batch_size * settings.num_generations,
        num_generations=settings.num_generations,
        gradient_accumulation_steps=1,
        max_completion_length=settings.max_new_tokens,
        generation_kwargs={"min_new_tokens": settings.max_new_tokens, "suppress_tokens": adapter.suppressed_token_ids()},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=settings.beta,
        loss_type=settings.loss_type,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        max_steps=total,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=device.type == "cpu",
        bf16=device.type == "cuda",
        seed=settings.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    result = FrameworkResult("trl", completion_tokens_per_step=settings.batch_size * settings.num_generations * settings.max_new_tokens)
    trainer = GRPOTrainer(
        model=adapter.model, reward_funcs=[letter_share], args=args, train_dataset=data, processing_class=adapter.processor
    )
    models = [trainer.model] + ([trainer.ref_model] if trainer.ref_model is not None else [])
    counter = VisionCounter(adapter, models)
    memory = PeakMemory(device)
    state: dict[str, Any] = {}

    generate = trainer._generate  # instrumentation only: time TRL's rollout (tokenize + generate + decode)

    def timed_generate(*a, **kw):
        _sync(device)
        started = time.perf_counter()
        out = generate(*a, **kw)
        _sync(device)
        state["rollout"] = time.perf_counter() - started
        return out

    trainer._generate = timed_generate

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            if st.global_step == settings.warmup:
                memory.__enter__()
            counter.reset()
            _sync(device)
            state["start"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            _sync(device)
            elapsed = time.perf_counter() - state["start"]
            if st.global_step > settings.warmup:  # global_step is already incremented here
                result.step_times.append(elapsed)
                result.rollout_times.append(state["rollout"])
                result.vision_calls.append(counter.calls)
                result.vision_images.append(counter.images)

    trainer.add_callback(Timer())
    with contextlib.redirect_stdout(None):
        trainer.train()
    memory.__exit__(None, None, None)
    result.peak_memory_bytes, result.memory_kind = memory.peak, memory.kind
    counter.close()
    del trainer, adapter
    gc.collect()
    return result


# ---------------------------------------------------------------- orchestration and report
def run_benchmark(settings: BenchSettings) -> dict[str, Any]:
    device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    twin = settings.model.split(":", 1)[1] if settings.model.startswith("bench:") else ""
    threads = settings.threads or DEFAULT_THREADS.get(twin, 1)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    results: dict[str, FrameworkResult] = {}
    with tempfile.TemporaryDirectory(prefix="vlm-grpo-bench-") as tmp:
        work = Path(tmp)
        adapter_cls = build_source(settings, work / "model")
        runners = {"vlm-grpo": run_vlm_grpo, "trl": run_trl}
        for name in settings.frameworks:
            torch.manual_seed(settings.seed)
            results[name] = runners[name](settings, adapter_cls, work / "model", device, work)
    report = {
        "settings": asdict(settings),
        "device": describe_device(device, threads),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
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
    return out


def format_report(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        (
            f"model {s['model']}: B={s['batch_size']} G={s['num_generations']} T={s['max_new_tokens']} (fixed), "
            f"beta={s['beta']} loss={s['loss_type']} image {s['image_size']} px, "
            f"{s['steps']} measured step(s) after {s['warmup']} warm-up"
        ),
        f"device: {report['device']}",
        "",
        "| framework | step time (s) | rollout (s) | rollout tokens/s | vision calls/step | images encoded/step | peak memory (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['step_time_s']:.2f} | {r['rollout_time_s']:.2f} | {r['rollout_tokens_per_s']:.0f} | "
            f"{r['vision_calls_per_step']} | {r['vision_images_per_step']} | {r['peak_memory_mib']:.0f} |"
        )
    for key, value in report.get("ratios", {}).items():
        lines.append(f"\n{key}: {value:.2f}x")
    return "\n".join(lines)
