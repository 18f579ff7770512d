"""How LoRA reaches vLLM (rollout/vllm/lora_sync.py: the adapter alone, or merged weights, and why), on tiny twins
of several families; and the per-process engine statistics taken over all processes (distributed/processes.py:
`.../min` and `.../max` as min and max), over a real 2-member gloo group."""

from __future__ import annotations

import json
import threading

import pytest
import torch
import torch.distributed as dist

from vlm_grpo.adapters.registry import adapter_class
from vlm_grpo.grpo.distributed.processes import extremes_over_processes
from vlm_grpo.grpo.rollout.vllm.lora_sync import MAX_RANKS, MODES, LoraPlan, plan_lora
from vlm_grpo.grpo.settings.sections import LoraSettings
from vlm_grpo.grpo.training.lora import apply_lora, lora_targets


def lora_adapter(family: str, r: int = 4, target_modules=None, train_fully=()):
    adapter = adapter_class(family).tiny(seed=0)
    torch.manual_seed(0)
    return apply_lora(adapter, LoraSettings(r=r, target_modules=target_modules), train_fully=train_fully)


# ---------------------------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_no_lora_is_merged_full_weights(family):
    adapter = adapter_class(family).tiny(seed=0)
    for mode in MODES:  # adapter mode too: there is no adapter to refuse
        plan = plan_lora(adapter, mode, True)
        assert not plan.adapter_only and "no LoRA" in plan.reason, mode
        assert plan.describe().startswith("vllm: merged weights synced")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "internvl", "idefics3"])
def test_plain_language_lora_goes_alone_with_its_rank_and_config(family):
    adapter = lora_adapter(family, r=4)
    plan = plan_lora(adapter, "auto", True)
    assert plan.adapter_only and plan.rank == 4, plan.reason
    assert plan_lora(adapter, "adapter", True).adapter_only
    config = json.loads(json.dumps(plan.config))  # plain JSON: written as adapter_config.json
    assert config == plan.config
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == sorted(lora_targets(adapter_class(family).tiny(seed=0),
                                                                   LoraSettings(r=4)))
    assert plan.max_lora_rank == 8
    assert plan.describe() == f"vllm: LoRA adapter synced alone (rank 4): {plan.reason}"


def test_merged_mode_always_merges():
    adapter = lora_adapter("internvl")
    plan = plan_lora(adapter, "merged", True)
    assert not plan.adapter_only and "merged" in plan.reason and plan.rank == 0


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="one of auto, adapter, merged"):
        plan_lora(lora_adapter("qwen2_5_vl"), "both", True)


def _refused(adapter, supports: bool, *words: str) -> None:
    """auto: merged, saying why; adapter: a ValueError with the same reason."""
    plan = plan_lora(adapter, "auto", supports)
    assert not plan.adapter_only and plan.rank == 0
    for word in words:
        assert word in plan.reason, (word, plan.reason)
    with pytest.raises(ValueError) as err:
        plan_lora(adapter, "adapter", supports)
    assert plan.reason in str(err.value) and "rollout.vllm_lora_sync adapter" in str(err.value)
    assert not plan_lora(adapter, "merged", supports).adapter_only


@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm"])
def test_a_family_whose_vllm_model_has_no_lora_is_merged(family):
    _refused(lora_adapter(family), False, family, "does not support LoRA")


@pytest.mark.parametrize(("family", "pattern"), [("qwen2_5_vl", r"visual\.merger\.mlp\.2\."),
                                                 ("idefics3", r"connector\.")])
def test_modules_trained_whole_are_merged(family, pattern):
    adapter = lora_adapter(family, train_fully=[pattern])
    assert adapter.model.peft_config["default"].modules_to_save
    _refused(adapter, True, "trainable_patterns")


@pytest.mark.parametrize(("family", "outside", "group"), [
    ("qwen2_5_vl", "visual.blocks.0.attn.qkv", "vision"),
    ("idefics3", "connector.modality_projection.proj", "projector"),
    ("internvl", "vision_tower.encoder.layer.1.attention.projection_layer", "vision"),
])
def test_lora_outside_the_language_model_is_merged_naming_the_module(family, outside, group):
    plain = adapter_class(family).tiny(seed=0)
    language = lora_targets(plain, LoraSettings(r=4))[0]  # one language projection, by its exact name
    targets = lora_targets(plain, LoraSettings(r=4, target_modules=[language, outside]))
    assert len(targets) == 2 and targets[1].endswith(outside)
    assert plain.module_group_of(language + ".weight") == "language"
    assert plain.module_group_of(targets[1] + ".weight") == group  # the stand-in is what it claims
    adapter = lora_adapter(family, target_modules=[language, outside])
    _refused(adapter, True, "outside the language model", targets[1])


def test_expert_tensors_are_merged():
    adapter = lora_adapter("qwen3_vl_moe")
    assert adapter.model.peft_config["default"].target_parameters
    _refused(adapter, True, "expert tensors")


def test_a_rank_above_vllms_largest_is_merged():
    one = ["model.language_model.layers.0.mlp.down_proj"]  # one small layer: a big rank stays cheap
    _refused(lora_adapter("qwen2_5_vl", r=MAX_RANKS[-1] + 8, target_modules=one), True, f"rank {MAX_RANKS[-1] + 8}")
    assert plan_lora(lora_adapter("qwen2_5_vl", r=MAX_RANKS[-1], target_modules=one), "auto", True).adapter_only


@pytest.mark.parametrize("rank", [1, 2, 4, 8, 9, 16, 17, 33, 64, 100, 128, 200, 256, 257, 320, 321, 512])
def test_max_lora_rank_is_the_smallest_allowed_at_least_r(rank):
    allowed = sorted(MAX_RANKS)
    want = min(r for r in allowed if r >= rank)
    got = LoraPlan(True, "", rank=rank).max_lora_rank
    assert got == want and got in MAX_RANKS and got >= rank
    assert all(r < rank for r in allowed if r < got)


# ---------------------------------------------------------------------------------------------- over processes
class GroupAccelerator:
    """What extremes_over_processes asks of accelerate's Accelerator, over a real gloo group: `gather` stacks every
    process's rows along dim 0, as accelerate's does."""

    num_processes = 2
    device = torch.device("cpu")

    def __init__(self, group):
        self.group = group

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        self.group.allgather([rows], [tensor.contiguous()]).wait()
        return torch.cat(rows, dim=0)


def on_two_processes(fn, inputs: list) -> list:
    """`fn(accelerator, inputs[rank])` on both members of a 2-member gloo group (one thread each)."""
    store = dist.HashStore()
    results: list = [None, None]
    failures: list = []

    def member(rank: int) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            group = dist.ProcessGroupGloo(store, rank, 2, options)
            results[rank] = fn(GroupAccelerator(group), inputs[rank])
        except Exception as err:  # noqa: BLE001 - re-raised below
            failures.append(err)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert all(not t.is_alive() for t in threads)
    return results


def test_min_and_max_statistics_are_taken_over_processes():
    first = {"sampling/logp_difference/min": 0.25, "sampling/logp_difference/max": 0.5,
             "sampling/logp_difference/mean": 0.375, "sampling/ratio/min": -3.0, "sampling/ratio/max": -1.0,
             "completions/length/min": 4, "completions/length/max": 12, "perf/push_s": 2.0, "min": 9.0,
             "tokens/max_new": 16.0, "ratio/minimum": 0.5}
    second = {"sampling/logp_difference/min": 0.125, "sampling/logp_difference/max": 0.75,
              "sampling/logp_difference/mean": 0.25, "sampling/ratio/min": -2.0, "sampling/ratio/max": -1.5,
              "completions/length/min": 6, "completions/length/max": 10, "perf/push_s": 4.0, "min": 1.0,
              "tokens/max_new": 32.0, "ratio/minimum": 0.0}
    results = on_two_processes(extremes_over_processes, [first, second])
    for rank, own in enumerate((first, second)):
        got = results[rank]
        assert set(got) == set(own)
        for key in own:
            if key.endswith("/min"):
                want = min(first[key], second[key])
            elif key.endswith("/max"):
                want = max(first[key], second[key])
            else:
                want = own[key]  # untouched: the process's own value, itself
                assert got[key] is own[key], key
            assert got[key] == pytest.approx(want, rel=1e-6), (rank, key)
    assert results[0]["sampling/ratio/min"] == -3.0 and results[1]["sampling/ratio/max"] == -1.0  # signs kept


def test_one_process_keeps_its_metrics():
    class One:
        num_processes = 1

    metrics = {"a/min": 1.0, "a/max": 2.0}
    assert extremes_over_processes(One(), metrics) == metrics
