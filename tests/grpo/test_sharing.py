"""Shared work across a GRPO group equals the plain path: shared-prefix rollout, shared and reused image
features in the log-prob forwards, chunked log-probs, and the per-step work counters."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.adapters.samples import mixed_batch, user_turn
from tests.conftest import families_with, families_without
from vlm_grpo.adapters.module_groups import vision_module
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.adapters.features import hf_core
from vlm_grpo.adapters.sharing import empty_static_cache, generate_shared, image_features
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.training.vision_counter import VisionCounter
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores, token_logprobs_and_entropy
from vlm_grpo.grpo.algorithm.losses import LossConfig, LossInputs, policy_loss as grpo_loss
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

G, T = 2, 5
TOL = 1e-5


def _prompts(adapter):
    """The contract suite's 3 image samples (sizes differ, one with 2 images) plus a text-only one."""
    conversations, images = mixed_batch(adapter)
    conversations.append(user_turn(0, "Say something without a picture."))
    images.append([])
    return adapter.encode_prompts(conversations, images)


def _completions(adapter, rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    banned = set(adapter.suppressed_token_ids()) | set(adapter.eos_token_ids)
    allowed = torch.tensor([i for i in range(len(adapter.tokenizer)) if i not in banned])
    ids = allowed[torch.randint(len(allowed), (rows, T), generator=gen)]
    mask = torch.ones(rows, T, dtype=torch.long)
    mask[1, 3:] = 0  # a completion that ended early
    return ids, mask


def _vision_param(adapter) -> torch.nn.Parameter:
    name = adapter.module_groups()["vision"][-1]
    return dict(adapter.model.named_parameters())[name]


def _loss(logps, mask):
    adv = torch.linspace(-1.0, 1.0, logps.shape[0])
    ref = logps.detach() + 0.01
    return grpo_loss(LossInputs(logps, adv, mask, ref_logps=ref), LossConfig(beta=0.04, max_completion_length=T))[0]


def _forward(adapter, prompts, ids, mask, **kwargs):
    index = [r // G for r in range(len(prompts) * G)]
    logps = group_scores(adapter, prompts, index, ids, mask, options=ScoreOptions(**kwargs)).logps
    return logps, _loss(logps, mask)


SHARING = families_with("shares_features")  # the families whose features the sharing paths place at image tokens


@pytest.mark.parametrize("family", SHARING)
def test_shared_features_match_the_plain_path_with_a_trainable_vision_tower(family):
    adapter = family_class(family).tiny(seed=0)
    prompts = _prompts(adapter)
    ids, mask = _completions(adapter, len(prompts) * G)
    param = _vision_param(adapter)
    results = {}
    for share in (False, True):
        adapter.model.zero_grad(set_to_none=True)
        with VisionCounter(adapter, [adapter.model]) as counter:
            logps, loss = _forward(adapter, prompts, ids, mask, share_features=share)
            loss.backward()
        results[share] = (logps.detach(), loss.detach(), param.grad.clone(), counter.snapshot())
    (lp0, loss0, grad0, plain), (lp1, loss1, grad1, shared) = results[False], results[True]
    assert (lp0 - lp1).abs().max().item() <= TOL
    assert abs(loss0.item() - loss1.item()) <= TOL
    assert grad0.abs().max() > 0
    assert ((grad0 - grad1).norm() / grad0.norm()).item() <= 1e-4
    assert shared["calls"] == 1 and plain["calls"] == 1  # one encoder call per forward either way ...
    assert shared["images"] * G == plain["images"]  # ... but the plain path encodes every image G times


@pytest.mark.parametrize("family", SHARING)
def test_reused_features_skip_the_encoder_and_match(family):
    adapter = family_class(family).tiny(seed=0)
    prompts = _prompts(adapter)
    ids, mask = _completions(adapter, len(prompts) * G, seed=1)
    for name, p in adapter.model.named_parameters():
        if adapter.module_group_of(name) in ("vision", "projector"):
            p.requires_grad_(False)
    with torch.no_grad():
        features = image_features(adapter, prompts).detach()  # what the rollout hands over
        plain, plain_loss = _forward(adapter, prompts, ids, mask, share_features=False)
    with VisionCounter(adapter, [adapter.model]) as counter:
        reused, reused_loss = _forward(adapter, prompts, ids, mask, features=features)
        reused_loss.backward()
    assert counter.calls == 0 and counter.images == 0
    assert (plain - reused).abs().max().item() <= TOL
    assert abs(plain_loss.item() - reused_loss.item()) <= TOL


@pytest.mark.parametrize("family", families_with("shares_prefix"))
def test_greedy_shared_prefix_rollout_equals_plain_greedy(family):
    adapter = family_class(family).tiny(seed=0)
    prompts = _prompts(adapter)
    settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, output_logits=True)
    plain = adapter.generate(prompts.repeat(G), **settings)
    shared = generate_shared(adapter, prompts, G, **settings)
    assert shared.shared
    length = prompts.input_ids.shape[1]
    assert torch.equal(plain.sequences[:, length:], shared.output.sequences[:, length:])
    diff = (torch.stack(plain.logits, 1) - torch.stack(shared.output.logits, 1)).abs().max().item()
    assert diff <= 1e-4
    assert shared.prefill_tokens < int(prompts.repeat(G).attention_mask.sum())
    assert shared.features.counts == adapter.feature_counts(prompts)


@pytest.mark.parametrize("family", families_with("shares_prefix"))
def test_static_cache_rollout_equals_the_dynamic_one(family):
    """generation.cache_implementation static: the shared prefix is copied into a StaticCache of every row's full
    length (generate() must not build its own beside it), and greedy decoding gives the dynamic cache's tokens and
    logits. A model with sliding-window or recurrent layers takes the plain path, where generate() builds its own
    static cache."""
    adapter = family_class(family).tiny(seed=0)
    prompts = _prompts(adapter)
    settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, output_logits=True)
    dynamic = generate_shared(adapter, prompts, G, **settings)
    adapter.model.generation_config.cache_implementation = "static"
    try:
        static = generate_shared(adapter, prompts, G, **settings)
    finally:
        adapter.model.generation_config.cache_implementation = None
    copyable = empty_static_cache(hf_core(adapter.model), 8) is not None
    assert static.shared == copyable
    length = prompts.input_ids.shape[1]
    assert torch.equal(dynamic.output.sequences[:, length:], static.output.sequences[:, length:])
    diff = (torch.stack(dynamic.output.logits, 1) - torch.stack(static.output.logits, 1)).abs().max().item()
    assert diff <= 1e-4


@pytest.mark.parametrize("family", families_without("shares_features"))
def test_families_without_sharing_take_the_plain_paths(family):
    """Asked to share, a family that declares no shared features or prefix gets the plain forward and rollout."""
    adapter = family_class(family).tiny(seed=0)
    conversations, images = mixed_batch(adapter)
    prompts = adapter.encode_prompts(conversations, images)
    ids, mask = _completions(adapter, len(prompts) * G)
    with torch.no_grad(), VisionCounter(adapter, [adapter.model]) as counter:
        plain, _ = _forward(adapter, prompts, ids, mask, share_features=False)
        asked, _ = _forward(adapter, prompts, ids, mask, share_features=True, share_prompt=True)
    assert torch.equal(plain, asked)
    assert counter.calls == 2  # each forward encoded its rows' images itself
    settings = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False)
    shared = generate_shared(adapter, prompts, G, **settings)
    assert not shared.shared and shared.features is None
    assert torch.equal(shared.output.sequences, adapter.generate(prompts.repeat(G), **settings).sequences)


def test_no_cache_policy_falls_back_to_the_plain_path():
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    adapter.use_cache = False  # what the loader hands in under --cache-policy no-cache
    prompts = _prompts(adapter)
    settings = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False)
    shared = generate_shared(adapter, prompts, G, **settings)
    assert not shared.shared and shared.features is None
    plain = adapter.generate(prompts.repeat(G), **settings)
    assert torch.equal(shared.output.sequences, plain.sequences)


def test_sampled_rollout_is_unchanged_for_a_fixed_seed():
    from vlm_grpo.grpo.settings.sections import GenerationConfig
    from vlm_grpo.grpo.rollout.generation import rollout
    from vlm_grpo.recipes import get_recipe

    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    samples = [get_recipe("shapes").build(size=4, image_size=56)[i] for i in range(3)]
    gen = GenerationConfig(max_new_tokens=6, min_new_tokens=6)
    outs = {}
    for shared in (False, True):
        torch.manual_seed(123)
        outs[shared] = rollout(adapter, samples, gen, G, "cpu", shared_prefix=shared)
    assert torch.equal(outs[False].completion_ids, outs[True].completion_ids)
    assert outs[True].features is not None and outs[False].features is None
    assert outs[True].stats["decode_tokens"] == outs[False].stats["decode_tokens"] == 3 * G * 6
    assert outs[True].stats["prefill_tokens"] < outs[False].stats["prefill_tokens"]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_match_full_log_softmax(temperature):
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50, dtype=torch.float64).float().requires_grad_(True)
    ids = torch.randint(50, (3, 7))
    weights = torch.randn(3, 7)
    full = torch.log_softmax(logits / temperature, -1)
    want = full.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    want_entropy = -(full.exp() * full).sum(-1)
    (want * weights).sum().backward()
    want_grad = logits.grad.clone()
    for chunk_bytes in (50 * 4 * 2, 50 * 4 * 7 * 2, 1 << 20):  # position blocks, row blocks, one block
        logits.grad = None
        got, entropy = token_logprobs_and_entropy(logits, ids, chunk_bytes=chunk_bytes, temperature=temperature)
        (got * weights).sum().backward()
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.allclose(entropy, want_entropy.detach(), atol=1e-5)
        assert torch.allclose(logits.grad, want_grad, atol=1e-6)


def test_vision_module_holds_exactly_the_vision_parameters(family):
    adapter = family_class(family).tiny(seed=0)
    module = vision_module(adapter.module_layout, adapter.model, adapter.family)
    inside = {id(p) for p in module.parameters()}
    groups = adapter.module_groups()
    params = dict(adapter.model.named_parameters())
    assert all(id(params[n]) in inside for n in groups["vision"])
    assert not any(id(params[n]) in inside for n in groups["language"] + groups["head"])


FAST = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4", "--logging.progress", "false",
        "--log-completions", "false", "--model", "tiny:qwen2_5_vl", "--max-steps", "2"]


def _run(tmp_path, name, *overrides):
    cfg = load_config(overrides=["--output-dir", str(tmp_path / name), *FAST, *overrides])
    return trained(GRPOTrainer.from_settings(cfg))


@pytest.mark.parametrize(
    "overrides, calls, images_per_call",
    [
        ((), 1, "B"),  # one encoder call with gradient, before the rollout, serves it and the update
        (("--encode-once", "false"), 2, "B"),  # rollout + policy forward, each encodes the B prompts' images once
        (("--beta", "0.04"), 2, "B"),  # + the reference copy's own encoder
        (("--freeze", "vision,projector"), 1, "B"),  # frozen: the rollout's features are reused
        (("--freeze", "vision,projector", "--reuse-frozen-features", "false"), 2, "B"),
        (("--shared-prefix", "false", "--share-image-features", "false"), 2, "BG"),  # the plain path
        # rollout + reference + two updates; the old log-probs (at the rollout's weights) reuse the rollout's features
        (("--beta", "0.04", "--num-iterations", "2"), 4, "B"),
        # a generation's first step: rollout + update (the old log-probs reuse the rollout's); its second: the update
        (("--steps-per-generation", "2"), (2, 1), "B"),
    ],
)
def test_step_metrics_count_vision_calls_and_tokens(tmp_path, overrides, calls, images_per_call):
    history = _run(tmp_path, "run", *overrides)
    b, g = 2, 4  # the default batch size and num_generations
    for step, metrics in enumerate(history):
        expected = calls[step] if isinstance(calls, tuple) else calls
        assert metrics["perf/vision_calls"] == expected
        assert metrics["perf/vision_images"] == expected * (b if images_per_call == "B" else b * g)
        assert metrics["perf/decode_tokens"] == b * g * 4
        assert metrics["perf/prefill_tokens"] > 0


def test_old_logprobs_from_the_rollouts_features_equal_encoding_again(tmp_path):
    """The old log-probs (taken before any update, at the rollout's weights) read the features the rollout already
    computed; encoding the images again gives the same log-probs."""
    cfg = load_config(overrides=["--output-dir", str(tmp_path / "run"), *FAST, "--max-steps", "1",
                                 "--steps-per-generation", "2"])
    trainer = GRPOTrainer.from_settings(cfg)
    stage = trainer.run
    generation = stage._rollout_batch(0)
    traj = generation.scored.trajectory
    assert traj.features is not None and traj.policy_features is None
    again = stage.scorer.policy_logps(replace(traj, features=None))  # the encoder runs again
    assert (again - traj.old_logps)[traj.completion_mask.bool()].abs().max().item() <= 1e-6


def test_encoding_once_before_the_rollout_gives_the_same_run(tmp_path):
    """The policy's features taken with gradient before the rollout (encode_once) sample the same completions and
    make the same updates as the rollout and the policy forward each running the encoder."""
    runs = {}
    for flag in ("true", "false"):
        cfg = load_config(overrides=["--output-dir", str(tmp_path / flag), *FAST, "--beta", "0.04", "--max-steps", "3",
                                     "--learning-rate", "1e-3", "--encode-once", flag, "--log-completions", "true"])
        trainer = GRPOTrainer.from_settings(cfg)
        history = trained(trainer)
        runs[flag] = (history, {n: p.detach() for n, p in trainer.adapter.model.named_parameters()})
    (once, weights_once), (twice, weights_twice) = runs["true"], runs["false"]
    assert [m["perf/vision_calls"] for m in once] == [2, 2, 2] and [m["perf/vision_calls"] for m in twice] == [3, 3, 3]
    assert [m["reward"] for m in once] == [m["reward"] for m in twice]  # the same completions
    for name, value in weights_once.items():
        assert torch.allclose(value, weights_twice[name], rtol=0, atol=1e-6), name


def test_compile_decode_true_compiles_the_static_decode_on_a_cpu_with_the_same_tokens():
    """generation.compile_decode true: transformers compiles the decode step over the static cache off a GPU too
    (inductor), and greedy decoding is unchanged; without a static cache the setting is refused."""
    from vlm_grpo.grpo.setting_fields import SettingError
    from vlm_grpo.grpo.settings.sections import GenerationConfig
    from vlm_grpo.grpo.training.policy import sampling_with

    with pytest.raises(SettingError, match="cache_implementation static"):
        GenerationConfig(compile_decode="true")
    adapter = family_class("qwen2_5_vl").tiny(seed=0)
    prompts = _prompts(adapter)
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, use_cache=True)
    with sampling_with(adapter.model, GenerationConfig(cache_implementation="static", compile_decode="false")):
        eager = generate_shared(adapter, prompts, G, **settings)
    compiled_calls = []
    forward = type(adapter.model).forward
    with sampling_with(adapter.model, GenerationConfig(cache_implementation="static", compile_decode="true")):
        config = adapter.model.generation_config.compile_config
        assert config._compile_all_devices
        original = adapter.model.get_compiled_call

        def spy(compile_config):
            compiled_calls.append(compile_config)
            return original(compile_config)

        adapter.model.get_compiled_call = spy
        try:
            compiled = generate_shared(adapter, prompts, G, **settings)
        finally:
            del adapter.model.get_compiled_call
    assert compiled_calls and compiled_calls[0] == config  # generate() took the compiled decode step (a copy)
    assert type(adapter.model).forward is forward
    assert torch.equal(eager.output.sequences, compiled.output.sequences)
