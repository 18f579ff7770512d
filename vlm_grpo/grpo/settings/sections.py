"""Run settings: every section of a run declared here, one dataclass each, every field with its help and limits.

Files and the command line are turned into these by `grpo/settings/sources.py`; a dataclass checks its values when
it is built, so nothing reaches a run unchecked. `vlm-grpo train --help` lists every field from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES, MULTI_OBJECTIVE
from vlm_grpo.grpo.algorithm.advantages.group import SCALE_REWARDS
from vlm_grpo.grpo.algorithm.losses import LossConfig
from vlm_grpo.grpo.distributed.fsdp import MODES as FSDP_MODES
from vlm_grpo.grpo.rewards.values import split_reward_spec
from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting
from vlm_grpo.grpo.settings.model import LoraSettings, ModelConfig
from vlm_grpo.grpo.settings.optim import OPTIMIZERS, OptimConfig  # noqa: F401 - names offered here too
from vlm_grpo.grpo.settings.rollout_section import RolloutConfig

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")  # accelerate's trackers; each is the package it needs


@dataclass
class DataConfig:
    recipe: str | None = setting(None, help="the task: shapes, cryptogram, vsr, clevr_count, mm_math, zoom, count_price, trl (your TRL-format "
                                 "rows), or your own Recipe as module:OBJECT / file.py:OBJECT (None: trl when "
                                 "data.dataset is set, else shapes)")
    dataset: str | None = setting(None, help="your data (= --dataset): a JSONL/JSON/parquet/CSV/arrow file, a folder "
                                  "datasets reads (save_to_disk, imagefolder, hub layout), or a hub id; read by the trl "
                                  "recipe, or by a file recipe as its path/hub_id")
    dataset_split: str | None = setting(None, help="the split of data.dataset trained on (None: train)")
    dataset_config: str | None = setting(None, help="the configuration of data.dataset (datasets' name=)")
    eval_dataset: str | None = setting(None, help="held-out data as data.dataset takes it, read at eval.split (None: "
                                       "eval.split of data.dataset, or of the recipe's own data)")
    prompt_key: str | None = setting(None, help="trl recipe: the prompt column (None: prompt)")
    image_key: str | None = setting(None, help="trl recipe: the image column (None: images, else image)")
    answer_key: str | None = setting(None, help="trl recipe: the answer column; rewards also receive it as solution")
    train_size: int = setting(256, help="samples in the training split the recipe builds", at_least=1, at_most=10_000_000)
    batch_size: int = setting(2, help="prompts per step, per process (B)", at_least=1, at_most=65536)
    num_generations: int = setting(4, help="completions per prompt (G): GRPO compares a prompt's completions, so >= 2",
                                   at_least=2, at_most=4096)
    recipe_options: dict[str, Any] = setting(factory=dict, help="options for the recipe's builder, e.g. {image_size: 64}")
    rewards: list[str] = setting(factory=list, help="name=module:function*weight entries (name, weight optional; "
                                 "--reward SPEC appends one); they replace the recipe's rewards")
    reward_models: list[str] = setting(factory=list, help="name=MODEL*weight entries (--reward-model MODEL appends one), "
                                       "scored after the other rewards: a sequence-classification model (path or hub "
                                       "id; its first logit for prompt + completion), or a VLM judge (judge:MODEL, or "
                                       "any VLM --model takes; P(yes) to judge_question)")
    judge_question: str | None = setting(None, help="what a VLM judge is asked about each answer, to be answered yes "
                                         "or no (None: whether the answer is correct for the image and question)")
    reward_weights: list[float] = setting(factory=list, help="one weight per reward, in order (as TRL's reward_weights): "
                                          "data.rewards or the recipe's, then data.reward_models; empty: each reward's own", at_least=-1e6, at_most=1e6)
    on_bad_sample: str = setting("error", resume="honoured", help="a bad row stops the run naming row and field, or is skipped",
                                 choices=("error", "skip"))
    video_frames: int = setting(8, help="frames sampled (evenly over its length) from each video file", at_least=1, at_most=4096)
    video_fps: float = setting(0.0, help="frames per second sampled from each video file instead of video_frames "
                               "(0: off); also the rate of a row's list of frames (0: 2 per second)", at_least=0.0, at_most=240.0)
    max_video_frames: int = setting(16, help="a video with more frames (a row's list of frames) is a bad row; a file "
                                    "is never sampled above it", at_least=1, at_most=4096)
    video_max_pixels: int = setting(224 * 224, help="video frames above this many pixels are scaled down (aspect kept) "
                                    "before the model's processor", at_least=1, at_most=4096 * 4096)
    on_reward_error: str = setting("raise", resume="honoured", help="a reward that raises or times out stops the run (one line naming it, "
                                   "its file:line, the completion, row and step), or scores 0 and is counted "
                                   "(reward_errors/NAME); one that calls sys.exit() always stops the run",
                                   choices=("raise", "zero"))
    reward_timeout: float = setting(0.0, help="seconds a reward call may run (0: no limit); one that overruns is stopped "
                                    "and counts under on_reward_error", at_least=0.0, at_most=86400.0)
    shuffle: bool = setting(True, help="draw the training rows in a new shuffled order each pass (false: in row "
                            "order; TRL's shuffle_dataset)")
    data_seed: int | None = setting(None, help="seed of the training data order (None: the run's seed; TRL's data_seed)", at_least=0, at_most=2**32 - 1)
    order: str = setting("reseeded", resume="refused", choices=("reseeded", "trl"),
                         help="how passes are shuffled: reseeded (each pass its own seed; a last partial batch runs "
                         "on into the next pass) or trl (TRL's RepeatSampler: one generator seeded once draws each "
                         "pass, a partial batch is dropped; a GRPOConfig built in Python uses it)")
    dynamic_sampling: bool = setting(False, resume="refused", help="DAPO's dynamic sampling: a prompt whose "
                                     "completions all get the same reward (no advantage) is dropped and the batch "
                                     "refilled from the next prompts in the run's order")
    dynamic_sampling_max_draws: int = setting(4, resume="honoured", help="dynamic sampling: further rollout batches "
                                              "a step may draw to refill; once spent, the batch is filled with "
                                              "prompts without spread (counted)", at_least=0, at_most=1000)
    chat_template_kwargs: dict[str, Any] = setting(factory=dict, help="extra arguments of the processor's "
                                                   "apply_chat_template when prompts are rendered (e.g. "
                                                   "{enable_thinking: false})")

    def __post_init__(self) -> None:
        check_fields(self)
        for key in ("rewards", "reward_models"):  # a weight of nan or 1e300 is refused here, before anything loads
            for spec in getattr(self, key):
                try:
                    split_reward_spec(spec) if isinstance(spec, str) else None
                except ValueError as err:
                    raise SettingError(key, str(err)) from None
        if self.recipe is None:  # naming a dataset without a recipe means TRL-format rows
            self.recipe = "trl" if self.dataset is not None else "shapes"


@dataclass
class GenerationConfig:
    max_new_tokens: int = setting(24, help="completion length limit (TRL: max_completion_length)", at_least=1, at_most=1_048_576)
    temperature: float = setting(1.0, help="sampling temperature (log-probs are taken at it too)", above=0.0, at_most=100.0)
    top_p: float = setting(1.0, help="nucleus sampling mass", above=0.0, at_most=1.0)
    top_k: int = setting(0, help="sample among the k most likely tokens (0: all)", at_least=0, at_most=10_000_000)
    min_new_tokens: int = setting(0, help="= max_new_tokens ignores EOS: fixed-length completions (benchmarks)",
                                  at_least=0, at_most=1_048_576)
    sampler: str = setting("inverse_cdf", help="how a token is drawn: inverse_cdf (one uniform per row on the cumulative "
                           "probabilities) or multinomial (generate()'s own); the same distribution",
                           choices=("inverse_cdf", "multinomial"))
    repetition_penalty: float = setting(1.0, help="generate()'s repetition penalty (1.0: none)", above=0.0, at_most=100.0)
    min_p: float | None = setting(None, help="keep tokens whose probability is at least min_p x the top one's "
                                  "(None: off)", at_least=0.0, at_most=1.0)
    cache_implementation: str | None = setting(None, help="generate()'s KV cache class, e.g. static (None: the "
                                               "model's default); static: fixed-shape tensors the decode step can be "
                                               "compiled over (the shared prompt prefix is copied into it)")
    compile_decode: str = setting("auto", help="torch.compile the decode step over a static cache: auto (as "
                                  "transformers does: on a GPU), true (also on a CPU, inductor: pays only where Python "
                                  "overhead dominates a step) or false", choices=("auto", "true", "false"))
    generation_kwargs: dict[str, Any] = setting(factory=dict, help="more transformers GenerationConfig fields for "
                                                "rollouts (e.g. {no_repeat_ngram_size: 3}), on the model's "
                                                "generation config while it samples")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.min_new_tokens > self.max_new_tokens:
            raise SettingError("min_new_tokens", f"{self.min_new_tokens} is above max_new_tokens ({self.max_new_tokens})")
        if self.compile_decode == "true" and self.cache_implementation != "static":
            raise SettingError("compile_decode", "true compiles the decode step over a static cache: set "
                               "generation.cache_implementation static too")


@dataclass
class ToolsConfig:
    """Multi-turn rollouts with tools (TRL 1.16's `tools` / `environment_factory`): on when any tool is named."""

    tools: list[str] = setting(factory=list, help="functions the model may call, module:function or file.py:function "
                               "(--tool SPEC appends one); added to the recipe's")
    environment: str | None = setting(None, help="an environment class (TRL's environment_factory), module:Class or "
                                      "file.py:Class, or a dict of classes picked by each sample's environment field; "
                                      "replaces the recipe's")
    recipe_tools: bool = setting(True, help="use the tools and environment the recipe ships (e.g. zoom's crop)")
    max_tool_calling_iterations: int | None = setting(None, help="tool rounds per completion (None: until the model "
                                                      "calls none or the completion budget is spent)", at_least=0, at_most=10_000)
    tool_timeout: float = setting(30.0, help="seconds a tool call may run before it counts as failed (0: no limit); "
                                  "it is stopped then and uses no CPU afterwards (see isolation)", at_least=0.0, at_most=86400.0)
    isolation: str = setting("thread", help="where a standalone tool with a time limit runs: thread (in the trainer, "
                             "stopped by an exception when it overruns: Python code that spins stops, a call blocked "
                             "in C is abandoned) or process (a forked worker, killed when it overruns: nothing "
                             "outlives the limit; the tool's effects on memory are lost, its result must pickle). "
                             "Environment methods always run in the trainer (their state persists)",
                             choices=("thread", "process"))
    on_tool_error: str = setting("model", help="a tool call that raises or times out: model (its error goes back to the "
                                 "model as the result and counts in tools/failure_frequency, as in TRL) or raise (the "
                                 "run stops naming the tool); a tool that calls sys.exit() always stops the run",
                                 choices=("model", "raise"))

    def __post_init__(self) -> None:
        self.tools = list(self.tools)
        check_fields(self)


@dataclass
class PerfConfig:
    """How a step shares work across a prompt's G completions. All on by default; off only to debug."""
    RESUME = "honoured"  # a resumed run honours a change to any of these

    shared_prefix: bool = setting(True, help="rollout: encode and prefill each prompt once, sample G completions from it")
    share_image_features: bool = setting(True, help="log-prob forwards: encode each image once for its G sequences")
    reuse_frozen_features: bool = setting(True, help="vision tower + projector frozen: reuse the rollout's features")
    encode_once: bool = setting(True, help="encoder trains, one update per rollout: the policy's image features are "
                                "computed once, with gradient, before the rollout, which samples from a detached copy")
    share_prompt: bool = setting(True, help="log-prob forwards: run each prompt once and let its G completions reuse "
                                 "its KV cache (off under gradient checkpointing, whose blocks drop the cache)")
    padding_free: str = setting("auto", help="log-prob forwards after a shared prompt: each prompt's completions "
                                "packed end to end into fewer rows, attention kept within each completion; auto: when "
                                "the rows fall by a tenth or more (docs/performance.md)",
                                choices=("auto", "on", "off"))
    logprob_chunk_mb: int = setting(256, help="fp32 logits of one chunk of positions, in MiB (the LM head scores "
                                    "completions chunk by chunk: no logits of all positions exist)", at_least=1, at_most=1_048_576)
    pixel_cache_mb: int = setting(1024, help="encoded prompts (tokens and processed pixels) kept across steps and "
                                  "epochs, keyed by the prompt text and the images' pixels: a row seen again skips the "
                                  "processor; least recently used rows dropped beyond this many MiB (0: off)",
                                  at_least=0, at_most=1_048_576)
    gradient_checkpointing: bool = setting(False, help="recompute the language model's and vision tower's blocks in "
                                           "backward instead of keeping their activations")
    gradient_checkpointing_kwargs: dict[str, Any] = setting(factory=dict, help="torch.utils.checkpoint arguments "
                                                            "(e.g. {use_reentrant: true}; default use_reentrant false)")
    full_determinism: bool = setting(False, help="deterministic kernels everywhere (transformers' "
                                     "enable_full_determinism): slower, bitwise repeatable")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class GuardConfig:
    RESUME = "honoured"  # a resumed run honours a change to any of these
    max_nonfinite_steps: int = setting(3, help="stop after this many consecutive steps with a non-finite loss or "
                                       "gradient (their updates are skipped; 0: never stop)", at_least=0, at_most=1_000_000)
    undo_nonfinite_updates: bool = setting(False, help="true: an update that makes a weight NaN or inf is undone "
                                           "(weights and optimizer state put back from a copy taken before each step: "
                                           "that copy costs their memory once more, too much for a full fine-tune of "
                                           "a large model) and counts as a skipped update; false: such an update "
                                           "stops the run at once, the newest checkpoint the last good")
    kl_spike_factor: float = setting(100.0, help="a mean KL this many times its recent median is a spike", above=1.0, at_most=1e12)
    kl_spike_min: float = setting(1e-3, help="KLs below this never count as spikes (tiny KLs jump by large factors)",
                                  at_least=0.0, at_most=1e6)
    kl_spike_warmup: int = setting(3, help="steps of KL history needed before judging", at_least=1, at_most=1_000_000)
    kl_spike_action: str = setting("warn", help="on a KL spike: warn, or stop before saving", choices=("warn", "stop"))
    # reward hacking and grounding (README "Reward hacking and grounding guards")
    audit_at_start: bool = setting(True, help="train: score adversarial completions of the first samples with the "
                                   "run's rewards before the first step (as vlm-grpo audit-rewards) and warn of exploits")
    audit_allow: list[str] = setting(factory=list, help="audit findings not warned of: reward names, adversary names "
                                     "or reward:adversary")
    on_hacking: str = setting("warn", help="a hacking or grounding monitor trips: warn (with example completions), or "
                              "save a checkpoint of the step and stop", choices=("warn", "stop"))
    monitor_window: int = setting(20, help="steps the trend monitors compare (the first third against the last)",
                                  at_least=3, at_most=1_000_000)
    hacking_rise: float = setting(0.3, help="a reward component rising by this share of its largest value over the "
                                  "window, with flat accuracy, trips the monitor", above=0.0, at_most=10.0)
    hacking_flat: float = setting(0.05, help="accuracy is flat when the share of right completions moves less than this "
                                  "over the window, plus twice its sampling noise", at_least=0.0, at_most=1.0)
    identical_groups: float = setting(0.5, help="share of groups with G identical completions that trips the monitor "
                                      "(2 steps in a row)", above=0.0, at_most=1.0)
    enumeration_rise: float = setting(0.2, help="rise of the share of completions listing several allowed answers that "
                                      "trips the monitor", above=0.0, at_most=1.0)
    length_limit_share: float = setting(0.5, help="share of completions cut at the length limit (after rising by 0.2) "
                                        "that trips the monitor", above=0.0, at_most=1.0)
    reliance_every: int = setting(10, help="measure image reliance every N steps (0: never)", at_least=0, at_most=1_000_000_000)
    reliance_samples: int = setting(2, help="prompts image reliance is measured on (with all their completions)",
                                    at_least=1, at_most=10_000)
    reliance_floor: float = setting(0.25, help="image reliance (mean of the last 3 measurements) below this share of "
                                    "its first 3 trips the monitor", above=0.0, below=1.0)

    def __post_init__(self) -> None:
        check_fields(self)
        self.audit_allow = list(self.audit_allow)


@dataclass
class LoggingConfig:
    RESUME = "honoured"  # a resumed run honours a change to any of these
    output_dir: str = setting("runs/latest", help="the run directory")
    save_every: int = setting(100, help="checkpoint every N steps (0: only at the end)", at_least=0, at_most=1_000_000_000)
    keep_checkpoints: int = setting(2, help="newest checkpoints kept (0: all)", at_least=0, at_most=1_000_000)
    log_completions: bool = setting(True, help="every completion with its rewards, advantage and flags: to "
                                    "completions.jsonl, completions/completions_NNNNN.parquet and a table per step in "
                                    "each tracker (TRL's log_completions)")
    log_multimodal: bool = setting(True, help="with log_completions: each prompt's images and video frames go with its "
                                   "completions (saved under completions/images/, shown in the trackers' tables and "
                                   "the report; TRL's log_multimodal)")
    report_to: list[str] = setting(factory=list, help="trackers (accelerate): tensorboard, wandb, mlflow, trackio (a "
                                   "local dashboard: its files under <output_dir>/trackio unless TRACKIO_DIR is set)",
                                   choices=TRACKERS)
    log_every: int = setting(1, help="send the step's metrics to the trackers every N steps (metrics.jsonl holds "
                             "every step)", at_least=1, at_most=1_000_000_000)
    checkpoint_at_end: bool = setting(True, help="checkpoint the last step too (false: only save_every's steps; "
                                      "TRL's save_strategy='no' is save_every 0 and this false)")
    progress: bool = setting(True, help="show a progress bar")
    save_merged: bool = setting(True, help="with LoRA, also write final/merged (the full model, deltas folded in)")
    plot: bool = setting(False, help="write the run's charts to <output_dir>/plots at the end")
    report: bool = setting(True, help="write <output_dir>/report.html at the end (curves, "
                           "completions with their images; `vlm-grpo report` writes it for any run)")
    run_name: str | None = setting(None, help="the run's name in wandb / mlflow")
    push_to_hub: bool = setting(False, help="push final/ (weights or LoRA adapter, processor, model card) to the hub")
    hub_model_id: str | None = setting(None, help="the hub repo to push to (default: the output directory's name)")
    hub_private: bool = setting(False, help="create the hub repo private")
    overwrite_output_dir: bool = setting(False, help="replace the run already in output_dir (its logs, checkpoints, "
                                         "final model); other files stay")
    final_at_end: bool = setting(True, help="save the trained model (or LoRA adapter) with its card in "
                                 "output_dir/final at the end (False: only when save_model() is called, as in TRL; a "
                                 "GRPOConfig built in Python does this)")
    keep_earlier_run: bool = setting(False, help="a run already in output_dir is moved into output_dir/earlier-<UTC "
                                     "time>/ (nothing removed) and the new run starts there, as a TRL script run twice "
                                     "expects (a GRPOConfig built in Python does this)")
    shared_dir_timeout: float = setting(30.0, help="several processes: seconds each one waits to see a file the main "
                                        "process wrote in output_dir before the run is refused as not shared by every "
                                        "machine (network filesystems can show new files late)", at_least=0, at_most=86400.0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class SFTStageConfig:
    """`vlm-grpo sft`: supervised warm-up on the recipe's reference responses. Steps, batch size, learning
    rates, freezing and LoRA come from the shared settings (max_steps, data.batch_size, optim.*, lora.*)."""

    max_reference_tokens: int = setting(256, help="longer references (end-of-turn token included) are cut", at_least=1, at_most=1_048_576)
    eval_every: int = setting(0, resume="honoured", help="greedy held-out evaluation every N steps and at the end (0: none)", at_least=0, at_most=1_000_000_000)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class EvalConfig:
    """`vlm-grpo eval` (and held-out evaluation inside a run): greedy decoding over a split."""
    RESUME = "honoured"  # a resumed run honours a change to any of these

    split: str = setting("test", help="the split evaluated")
    size: int = setting(64, help="samples evaluated", at_least=1, at_most=10_000_000)
    eval_batch_size: int = setting(8, help="prompts per generate() call", at_least=1, at_most=65536)
    length_edges: list[int] = setting(factory=list, help="reasoning-length bucket edges (empty: quartiles)", at_least=0, at_most=1_048_576)
    out: str | None = setting(None, help="JSON report path (None: <output_dir>/eval-<split>.json)")
    data_seed: int | None = setting(None, help="seed of the evaluated samples (None: the run's seed)", at_least=0, at_most=2**32 - 1)
    before_after: bool = setting(False, help="train: evaluate before the first and after the last GRPO step")
    image_reliance: bool = setting(False, help="answer every sample again with its image blanked; report that accuracy "
                                   "and the drop (what the answers owe to the image)")
    sampled_generations: int = setting(0, help="GRPO runs' evaluate(): completions sampled per held-out prompt, as in "
                                   "training, for the eval loss and sampled rewards beside the greedy answers (0: "
                                   "data.num_generations; TRL's num_generations_eval)", at_least=0, at_most=4096)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class TrainConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    guard: GuardConfig = dataclasses.field(default_factory=GuardConfig)
    sft: SFTStageConfig = dataclasses.field(default_factory=SFTStageConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    perf: PerfConfig = dataclasses.field(default_factory=PerfConfig)
    tools: ToolsConfig = dataclasses.field(default_factory=ToolsConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    max_steps: int = setting(3, resume="honoured", help="optimizer steps of the run (GRPO: rollout batches)", at_least=1, at_most=1_000_000_000)
    epochs: float = setting(0.0, resume="honoured", help="run length in passes over the training split (TRL's num_train_epochs), "
                            "instead of max_steps when > 0: ceil(epochs x rows // prompts per step) steps", at_least=0.0, at_most=1e6)
    advantage: str = setting("group", help=f"the advantage estimator: one of {' | '.join(sorted(ADVANTAGES))}, or "
                             "package.module:Class, an AdvantageEstimator subclass (docs/algorithms.md)")
    scale_rewards: str = setting("group", help="group advantages: what a group's centred reward is divided by: the "
                                 "group's reward std, the batch's, or nothing", choices=SCALE_REWARDS,
                                 values={True: "group", False: "none", "true": "group", "false": "none"})
    multi_objective_aggregation: str = setting("sum_then_normalize", help="several rewards: sum their weighted "
                                               "scores, or normalise each within its group first (GDPO)",
                                               choices=MULTI_OBJECTIVE)
    num_iterations: int = setting(1, help="optimizer updates per rollout batch", at_least=1, at_most=1000)
    steps_per_generation: int = setting(1, resume="refused", help="optimizer steps one rollout batch feeds: its "
                                        "completions, shuffled, are split into this many equal parts, one per step, "
                                        "all but the first off-policy (their old log-probs are taken when sampled; "
                                        "TRL's steps_per_generation / gradient_accumulation_steps)", at_least=1, at_most=100_000)
    gradient_accumulation_steps: int = setting(1, resume="honoured", help="micro-batches per update (whole prompt groups each)", at_least=1, at_most=100_000)
    mixed_precision: str = setting("no", help="bf16: weights stored in bfloat16, float32 master weights in the optimizer "
                                   "(autocast with a 4-bit base or fsdp); fp16: autocast with a loss scaler",
                                   choices=("no", "bf16", "fp16"))
    fsdp: str = setting("no", resume="fixed", help="shard weights, gradients and optimizer state across processes (torch FSDP2): "
                        "full_shard, or shard_grad_op (blocks keep their weights from forward to backward); also on "
                        "under accelerate launch --use_fsdp --fsdp_version 2", choices=FSDP_MODES,
                        values={"full_shard auto_wrap": "full_shard", "shard_grad_op auto_wrap": "shard_grad_op"})
    seed: int = setting(0, help="seed of data order, sampling, tiny twins and presets", at_least=0, at_most=2**32 - 1)
    resume: bool = setting(False, resume="ignored", help="continue from the newest checkpoint that verifies")
    resume_from: str | None = setting(None, resume="ignored", help="continue from this checkpoint directory (verified first)")
    trust_checkpoint: bool = setting(False, resume="ignored", help="resume: also unpickle checkpoint files that are not plain data "
                                     "(they can run code: only for a checkpoint you wrote or trust; never saved)")
    resume_accept: list[str] = setting(factory=list, resume="ignored", help="on resume, settings that may differ from the checkpoint's "
                                       "although they change what the run means (section.field names, num_processes, "
                                       "or all); recorded in config.yaml's history and the model card")

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():  # from Python: a section may come as a mapping; the model as its spec
            value = getattr(self, name)
            if isinstance(value, dict):
                try:
                    setattr(self, name, cls(**value))
                except SettingError as err:  # named by its dotted key, as from YAML or the command line
                    raise err.within(name) from None
                except TypeError as err:
                    raise SettingError(name, f"{err}".replace("__init__()", cls.__name__)) from None
            elif name == "model" and isinstance(value, str):
                self.model = ModelConfig(name=value)  # TrainConfig(model="tiny:FAMILY"), as --model takes it
            elif not isinstance(value, cls):
                raise SettingError(name, f"is a section: give a {cls.__name__} or a mapping of its fields, "
                                   f"not {type(value).__name__}")
        check_fields(self)
        ADVANTAGES[self.advantage]  # an unknown name, or a path that does not import, is refused here
        completions = self.data.batch_size * self.data.num_generations
        if self.steps_per_generation > 1 and completions % (self.steps_per_generation * self.gradient_accumulation_steps):
            raise SettingError("steps_per_generation", f"{self.steps_per_generation} steps x gradient_accumulation_steps "
                               f"{self.gradient_accumulation_steps} does not divide the {completions} completions of a "
                               "rollout batch (data.batch_size x data.num_generations) into equal micro-batches")
        if self.steps_per_generation == 1 and self.data.batch_size % self.gradient_accumulation_steps:
            raise SettingError("gradient_accumulation_steps", f"{self.gradient_accumulation_steps} does not divide "
                               f"data.batch_size ({self.data.batch_size}): each micro-batch holds whole prompts")
        if self.loss.sync_ref_model and self.lora.r > 0:
            raise SettingError("loss.sync_ref_model", "with LoRA the reference is the base model with the adapter "
                               "switched off, not a copy that can be synced (lora.r > 0); TRL refuses this too")
        if self.fsdp != "no" and self.lora.load_in_4bit:
            raise SettingError("fsdp", "4-bit weights cannot be sharded here: use LoRA on a bf16 base, or fsdp no")
        if self.rollout.uses_vllm:
            self._check_vllm()
        if self.rollout.asynchronous:
            self._check_asynchronous()
        # dr_grpo's normaliser is the completion length limit: derived, never set on its own
        self.loss.max_completion_length = self.generation.max_new_tokens

    def _check_vllm(self) -> None:
        """What the vLLM engine cannot do here, refused before anything loads."""
        if self.rollout.vllm_lora_sync == "adapter" and self.lora.r == 0:
            raise SettingError("rollout.vllm_lora_sync", "adapter sends a LoRA adapter alone, and this run has none "
                               "(lora.r 0): use auto")
        if self.rollout.vllm_tensor_parallel_size > 1:
            if self.rollout.vllm_mode == "server":
                raise SettingError("rollout.vllm_tensor_parallel_size", "is colocate's: a server's engine is as "
                                   "wide as `vlm-grpo vllm-serve --tensor-parallel-size` made it; leave it 1 here")
        if self.loss.loss_type == "vespo" and self.rollout.vllm_importance_sampling_correction:
            raise SettingError("rollout.vllm_importance_sampling_correction", "vespo folds the vLLM ratio into its "
                               "own weight, which is not done here: set it false, or use another loss_type")

    def _check_asynchronous(self) -> None:
        """What asynchronous rollouts cannot do here, refused before anything loads."""
        k = f"{self.rollout.max_staleness}"
        if self.rollout.uses_vllm and self.rollout.vllm_mode != "server":
            raise SettingError("rollout.max_staleness", f"{k} with rollout.engine vllm in vllm_mode colocate: "
                               "asynchronous rollouts go to a `vlm-grpo vllm-serve` server (vllm_mode server) or "
                               "to the transformers engine's worker process")
        clashes = (("steps_per_generation", self.steps_per_generation > 1, "a rollout batch feeding several steps"),
                   ("fsdp", self.fsdp != "no", "a sharded policy (the worker holds a whole copy)"),
                   ("lora.load_in_4bit", self.lora.load_in_4bit, "4-bit weights (the worker's copy cannot be "
                    "made from them)"))
        for name, clash, what in clashes:
            if clash:
                raise SettingError("rollout.max_staleness", f"{k} with {name}: asynchronous rollouts do not take "
                                   f"{what}; set rollout.max_staleness 0, or change {name}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig)
                             if dataclasses.is_dataclass(f.default_factory)}
