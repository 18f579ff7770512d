"""The rollout section: what generates the completions (the policy's generate(), or vLLM), with TRL's vllm_* names."""

from __future__ import annotations

from dataclasses import dataclass

from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting

ENGINES = ("transformers", "vllm")
VLLM_MODES = ("colocate", "server")
WEIGHT_TRANSPORTS = ("http", "distributed")
LORA_SYNCS = ("auto", "adapter", "merged")  # rollout/vllm/lora_sync.py
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL 1.16's


@dataclass
class RolloutConfig:
    """What generates the completions: the policy's own generate() (transformers), or vLLM (rollout/vllm/engine.py),
    in this process (colocate) or in a `vlm-grpo vllm-serve` server. The vllm_* names are TRL's (GRPOConfig).
    Where vLLM runs and how the weights reach it may change on resume (the same policy samples either way)."""

    engine: str = setting("transformers", help="transformers: the policy's generate() (shared prefix and image "
                          "features); vllm: vLLM samples, the trainer recomputes the log-probs (TRL: use_vllm)",
                          choices=ENGINES)
    vllm_mode: str = setting("colocate", resume="honoured", help="vLLM in this process (colocate), or a `vlm-grpo vllm-serve` server",
                             choices=VLLM_MODES)
    vllm_sync_steps: int = setting(1, help="push the policy's weights to vLLM every N optimizer steps (LoRA merged "
                                   "first); 1: after every step, as TRL", at_least=1, at_most=1_000_000_000)
    vllm_weight_transport: str = setting("http", resume="honoured", help="server mode: how weights reach the server: http (streamed "
                                         "over the server's port) or distributed (a torch.distributed group made "
                                         "at the handshake: NCCL on GPUs, gloo on CPUs; the server must reach "
                                         "no one, the trainer connects to vllm_group_port)", choices=WEIGHT_TRANSPORTS)
    vllm_group_port: int = setting(51216, resume="honoured", help="server mode, distributed transport: the port of the weight group's "
                                   "rendezvous on the server's host (TRL's name and default)", at_least=1, at_most=65535)
    vllm_lora_sync: str = setting("auto", resume="honoured", help="LoRA: auto sends the adapter alone where vLLM runs LoRA for the model "
                                  "(else merged weights; the log says which), adapter requires it, merged always "
                                  "merges (TRL's way)", choices=LORA_SYNCS)
    vllm_gpu_memory_utilization: float = setting(0.3, resume="honoured", help="colocate on a GPU: share of its memory vLLM takes",
                                                 above=0.0, at_most=1.0)
    vllm_cpu_kvcache_gb: float = setting(1.0, resume="honoured", help="colocate on a CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE)",
                                         above=0.0, at_most=1e5)
    vllm_max_model_length: int | None = setting(None, help="vLLM's context length (None: the model's, at most "
                                                "4096)", at_least=16, at_most=10_000_000)
    vllm_tensor_parallel_size: int = setting(1, help="colocate: processes per vLLM engine, its tensor-parallel "
                                             "ranks (k consecutive launched processes drive one engine together)",
                                             at_least=1, at_most=1024)
    vllm_server_base_url: str | None = setting(None, resume="honoured", help="server mode: the server's URL (None: from host and port)")
    vllm_server_host: str = setting("127.0.0.1", resume="honoured", help="server mode: the server's host")
    vllm_server_port: int = setting(8000, resume="honoured", help="server mode: the server's port", at_least=1, at_most=65535)
    vllm_server_key_file: str | None = setting(None, resume="honoured", help="server mode: a file holding the server's key (None: the "
                                               "VLM_GRPO_VLLM_KEY environment variable)")
    vllm_server_timeout: float = setting(240.0, resume="honoured", help="server mode: seconds to wait for the server to answer",
                                         above=0.0, at_most=86400.0)
    max_staleness: int = setting(0, resume="refused", help="asynchronous rollouts: a worker samples the batches of "
                                 "the next K steps while the trainer trains the current one, from weights at most K "
                                 "steps old, each token's loss weighed by the bounded ratio of the trainer's to the "
                                 "sampler's probabilities (the vllm_importance_sampling_* settings); 0: the "
                                 "synchronous loop (docs/performance.md)", at_least=0, at_most=64)
    worker_threads: int = setting(0, resume="honoured", help="asynchronous rollouts on the transformers engine: torch "
                                  "threads of the worker process, which holds its own copy of the policy (0: as many "
                                  "as the trainer's)", at_least=0, at_most=4096)
    vllm_importance_sampling_correction: bool = setting(True, help="weigh each token's loss by the truncated "
                                                        "ratio of trainer to vLLM probabilities (TRL's default; "
                                                        "asynchronous rollouts: to the worker's)")
    vllm_importance_sampling_mode: str = setting("sequence_mask", help="per token or per sequence; truncate "
                                                 "(clip the ratio) or mask (zero it outside the bounds)",
                                                 choices=IS_MODES)
    vllm_importance_sampling_clip_max: float | None = setting(3.0, help="the ratio's upper bound (None: none)",
                                                              above=0.0, at_most=1e6)
    vllm_importance_sampling_clip_min: float | None = setting(None, help="the ratio's lower bound (None: none)",
                                                              at_least=0.0, at_most=1e6)

    def __post_init__(self) -> None:
        check_fields(self)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low > high:
            raise SettingError("vllm_importance_sampling_clip_min", f"{low} is above vllm_importance_sampling_clip_max "
                               f"({high})")

    @property
    def asynchronous(self) -> bool:
        return self.max_staleness > 0

    @property
    def uses_vllm(self) -> bool:
        return self.engine == "vllm"
