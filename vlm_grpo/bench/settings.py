"""What one benchmark run compares: the settings both frameworks share."""

from __future__ import annotations

from dataclasses import dataclass

FRAMEWORKS = ("vlm-grpo", "trl")
ENGINES = ("transformers", "vllm")  # what samples the rollouts: generate() or vLLM (colocate), in both frameworks
# torch threads per CPU model, as measured in benchmarks/RESULTS.md (others: 1)
DEFAULT_THREADS = {"preset:qwen2_5_vl_small": 2, "preset:hybrid_vit_heavy": 1}


PRECISIONS = ("fp32", "bf16")


def precision_on(settings, device) -> str:
    """The precision both frameworks run in: the asked one, else bf16 on a GPU and fp32 on a CPU."""
    if settings.precision is None:
        return "bf16" if device.type == "cuda" else "fp32"
    if settings.precision not in PRECISIONS:
        raise ValueError(f"precision {settings.precision!r}: use one of {', '.join(PRECISIONS)}")
    return settings.precision


@dataclass
class BenchSettings:
    model: str = "preset:qwen2_5_vl_small"  # a --model value (CPU: preset:qwen2_5_vl_small / hybrid_vit_heavy)
    batch_size: int = 4  # prompts per step (B)
    num_generations: int = 8  # completions per prompt (G)
    max_new_tokens: int = 64  # every completion has exactly this many tokens (EOS ignored), unless `lengths` varies
    lengths: str = "fixed"  # or uniform:LO:HI / longtail:LO:HI: each completion ends at a drawn length (lengths.py)
    beta: float = 0.04
    loss_type: str = "dapo"  # a registered loss; with "trl" in frameworks, one of TRL's (runners.TRL_LOSS_TYPES)
    importance_sampling_level: str = "token"  # or "sequence" (GSPO)
    learning_rate: float = 1e-5
    image_size: int = 224
    images_per_prompt: int = 1  # images in each prompt, in both frameworks (the shapes recipe's canvases)
    # prompts in the dataset (None: enough that every step sees new ones); fewer than the steps' prompts make the run
    # go over them again, as later epochs do (then vlm-grpo's prompt cache skips the processor)
    prompts: int | None = None
    pixel_cache_mb: int = 1024  # vlm-grpo's prompt cache (perf.pixel_cache_mb; 0: off, for ablations)
    steps: int = 3  # measured steps per framework
    warmup: int = 1  # steps run first and not measured (cache probe, allocator warm-up)
    threads: int | None = None  # torch intra-op threads on CPU (None: DEFAULT_THREADS for the model, else 1)
    seed: int = 0
    frameworks: tuple[str, ...] = FRAMEWORKS
    freeze: tuple[str, ...] = ()  # module groups frozen in both frameworks
    shared_prefix: bool = True  # vlm-grpo's sharing switches (off: the plain path, for ablations)
    share_image_features: bool = True
    padding_free: str = "auto"  # vlm-grpo's log-prob forwards: packed completions (on), padded rows (off), or auto
    sampler: str = "inverse_cdf"  # vlm-grpo's token draw (multinomial: generate()'s own, for ablations)
    lora_r: int = 0  # > 0: LoRA of this rank on the language model's projections, in both frameworks
    load_in_4bit: bool = False  # QLoRA: the base loaded in 4 bit (bitsandbytes NF4) in both frameworks; needs lora_r
    device: str | None = None  # default: cuda if available, else cpu
    precision: str | None = None  # fp32 | bf16 in both frameworks (None: bf16 on a GPU, fp32 on a CPU)
    engine: str = "transformers"  # vllm: vlm-grpo's rollout.engine vllm, TRL's use_vllm (vllm_mode colocate)
    max_staleness: int = 0  # vlm-grpo's rollout.max_staleness (asynchronous rollouts; TRL has none)
    worker_threads: int = 0  # vlm-grpo's rollout.worker_threads (0: as many as the trainer's)
