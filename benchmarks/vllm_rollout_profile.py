"""One bench rollout, vLLM's generate against the trainer's own generate() path, on the same model and prompts, and
where vLLM's generate spends its time (cProfile, cumulative seconds of vLLM's stages). Times are the process's
CPU seconds (vLLM runs in this process, VLLM_ENABLE_V1_MULTIPROCESSING=0), one torch thread. Run in the vLLM venv:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1 \
        python benchmarks/vllm_rollout_profile.py --model preset:qwen2_5_vl_vllm_tiny

The bench's settings: B prompts of the shapes recipe (224-px images), G completions each, exactly T tokens (EOS
ignored), temperature 1, suppressed ids excluded, each sampled token's log-prob returned (as the trainer asks).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch

from vlm_grpo.bench.runners import _samples
from vlm_grpo.bench.settings import BenchSettings
from vlm_grpo.grpo.rollout.generation import rollout
from vlm_grpo.grpo.rollout.vllm.requests import requests, sampling_options
from vlm_grpo.grpo.rollout.vllm.runtime import build_llm, llm_generate, max_model_len, reset_caches
from vlm_grpo.grpo.rollout.vllm.weights import export_model
from vlm_grpo.loader import load_model

# vLLM 0.32's stages of LLM.generate, by function name (file, function): cumulative seconds under cProfile
STAGES = [
    ("entrypoints/llm.py", "generate", "LLM.generate (all)"),
    ("v1/engine/input_processor.py", "process_inputs", "input processing (HF processor on text + images)"),
    ("v1/engine/llm_engine.py", "step", "engine steps (schedule + model + outputs)"),
    ("v1/core/sched/scheduler.py", "schedule", "scheduler.schedule"),
    ("v1/core/sched/scheduler.py", "update_from_output", "scheduler.update_from_output"),
    ("v1/worker/gpu_model_runner.py", "_update_states", "model runner: batch state update"),
    ("v1/worker/gpu_model_runner.py", "_prepare_inputs", "model runner: prepare inputs"),
    ("v1/worker/gpu_model_runner.py", "_execute_mm_encoder", "model runner: vision encoder"),
    ("v1/worker/gpu_model_runner.py", "_model_forward", "model runner: LM forward"),
    ("v1/worker/gpu_model_runner.py", "_sample", "model runner: sampler (+ logprobs)"),
    ("v1/engine/output_processor.py", "process_outputs", "output processing (detokenize, logprobs)"),
]


def stage_seconds(stats: pstats.Stats) -> dict[str, float]:
    out = {label: 0.0 for _, _, label in STAGES}
    for (filename, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        for path, function, label in STAGES:
            if filename.endswith(path) and name == function:
                out[label] += cumulative
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:qwen2_5_vl_vllm_tiny")
    parser.add_argument("--batch-size", type=int, default=BenchSettings.batch_size)
    parser.add_argument("--num-generations", type=int, default=BenchSettings.num_generations)
    parser.add_argument("--max-new-tokens", type=int, default=BenchSettings.max_new_tokens)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = BenchSettings(model=args.model, batch_size=args.batch_size, num_generations=args.num_generations,
                             max_new_tokens=args.max_new_tokens)
    adapter = load_model(args.model, dtype=torch.float32, device="cpu", decide_cache=False)
    samples = _samples(settings, args.batch_size * (args.repeats + 1))
    gen = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens,
                          min_new_tokens=args.max_new_tokens, sampler="inverse_cdf", repetition_penalty=1.0)
    g, tokens = args.num_generations, args.batch_size * args.num_generations * args.max_new_tokens
    print(f"{args.model}: B={args.batch_size} G={g} T={args.max_new_tokens} ({tokens} completion tokens per rollout)")

    batches = [samples[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.repeats + 1)]

    def timed(fn, before=lambda: None) -> list[float]:
        """fn(batch) on a new batch each time (as each step draws new prompts), the first call a warm-up."""
        times = []
        for batch in batches:
            before()
            started = time.process_time()  # the process's CPU seconds: steadier than wall time on a shared machine
            fn(batch)
            times.append(time.process_time() - started)
        return times[1:]

    def report(name: str, times: list[float]) -> None:
        median = statistics.median(times)
        print(f"{name}: median {median:.3f} CPU s ({', '.join(f'{t:.3f}' for t in times)}), {tokens / median:.0f} tok/s")

    device = torch.device("cpu")
    report("trainer's rollout (generate(), encode included)", timed(lambda b: rollout(adapter, b, gen, g, device)))
    with tempfile.TemporaryDirectory() as tmp:
        export_model(adapter, tmp)
        started = time.perf_counter()
        length = max_model_len(adapter, SimpleNamespace(rollout=SimpleNamespace(vllm_max_model_length=None)))
        llm = build_llm(tmp, max_model_len=length, seed=0, gpu_memory_utilization=0.3, kvcache_gb=1, on_cpu=True)
        print(f"vLLM engine build: {time.perf_counter() - started:.1f} s; torch threads after it: {torch.get_num_threads()}")
        options = sampling_options(adapter, gen, g, seed=0)

        def after_push():  # the caches as a weight push leaves them (rollout/vllm/runtime.py, llm_load_weights)
            reset_caches(llm)

        variants = {"log-probs on, detokenized": {"detokenize": True},
                    "log-probs off, detokenized": {"detokenize": True, "logprobs": None},
                    "log-probs on, not detokenized": {"detokenize": False}}
        for name, change in variants.items():
            report(f"vLLM generate, {name}", timed(lambda b: llm_generate(llm, requests(adapter, b), {**options, **change}),
                                                   after_push))
        for name, change in variants.items():
            after_push()
            profile = cProfile.Profile(time.process_time)  # CPU seconds, as above
            profile.enable()
            llm_generate(llm, requests(adapter, batches[0]), {**options, **change})
            profile.disable()
            print(f"under cProfile, {name} (one generate; the profiler inflates Python-heavy stages), cumulative CPU s:")
            for label, seconds in stage_seconds(pstats.Stats(profile)).items():
                print(f"  {label}: {seconds:.3f}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(8)

if __name__ == "__main__":
    main()
