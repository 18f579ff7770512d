"""Run by test_vllm_weights.py under `torchrun --nproc_per_node 2` (CPU, gloo): each case builds the same tiny twin on
both ranks (LoRA initialised from one seed), keeps an unsharded copy, shards the model with fsdp.shard and streams
every part. Each rank compares the sharded stream with the unsharded copy's, tensor by tensor, and counts how many
shard units are unsharded at once: by the calls (each unit's unshard/reshard wrapped) and by the parameters
themselves (a unit is unsharded while one of its parameters is not a DTensor), looked at on every yielded tensor;
a control (fsdp.gathered: every unit at once) shows both counts see unsharded units.
Rank 0 writes the report (argv[1]); a mismatch on rank 1 is reported too."""

from __future__ import annotations

import copy
import json
import sys

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from vlm_grpo.adapters.registry import adapter_class  # noqa: E402
from vlm_grpo.grpo.distributed.fsdp import gathered, shard  # noqa: E402
from vlm_grpo.grpo.rollout.vllm.weights import PARTS, PolicyWeights  # noqa: E402
from vlm_grpo.grpo.settings.sections import LoraSettings  # noqa: E402
from vlm_grpo.grpo.training.lora import apply_lora  # noqa: E402

CASES = [("qwen2_5_vl", False, torch.float32), ("internvl", True, torch.float32), ("idefics3", True, torch.bfloat16)]


def build(family: str, lora: bool, dtype: torch.dtype):
    adapter = adapter_class(family).tiny(seed=0)
    adapter.model.to(dtype)
    if lora:
        torch.manual_seed(0)  # the same LoRA init on both ranks
        apply_lora(adapter, LoraSettings(r=4, alpha=8))
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in adapter.model.named_parameters():
                if ".lora_A." in name or ".lora_B." in name:
                    param.copy_((torch.randn(param.shape, generator=generator) * 0.2).to(param.dtype))
    return adapter


def managed(units: list[torch.nn.Module]) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """Each unit's own parameters (module, attribute): those of its subtree that no inner unit holds."""
    owned: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for unit in units:
        stack, mine = [unit], []
        while stack:
            module = stack.pop()
            mine += [(module, n) for n, _ in module.named_parameters(recurse=False)]
            stack += [c for c in module.children() if not isinstance(c, FSDPModule)]
        owned[id(unit)] = mine
    return owned


class Watch:
    """Counts unsharded units: by wrapping each unit's unshard/reshard, and by looking at the parameters."""

    def __init__(self, root: torch.nn.Module):
        self.units = [m for m in root.modules() if isinstance(m, FSDPModule)]
        self.owned = managed(self.units)
        self.open: set[int] = set()
        self.most_by_calls = 0
        self.calls = 0
        self.most_seen = 0
        for unit in self.units:
            self._wrap(unit)

    def _wrap(self, unit) -> None:
        unshard, reshard = unit.unshard, unit.reshard

        def counted_unshard(*args, **kwargs):
            result = unshard(*args, **kwargs)
            self.calls += 1
            self.open.add(id(unit))
            self.most_by_calls = max(self.most_by_calls, len(self.open))
            return result

        def counted_reshard(*args, **kwargs):
            result = reshard(*args, **kwargs)
            self.open.discard(id(unit))
            return result

        unit.unshard, unit.reshard = counted_unshard, counted_reshard

    def unsharded_now(self) -> int:
        return sum(any(not isinstance(getattr(m, n), DTensor) for m, n in self.owned[id(u)]) for u in self.units)

    def look(self) -> None:
        self.most_seen = max(self.most_seen, self.unsharded_now())


def run_case(family: str, lora: bool, dtype: torch.dtype) -> dict:
    adapter = build(family, lora, dtype)
    reference = copy.deepcopy(adapter.model)
    want = {part: [(n, t.detach().clone()) for n, t in PolicyWeights(reference).stream(part)] for part in PARTS}
    if not lora:  # the unsharded stream is the state_dict itself
        state = reference.state_dict()
        assert [n for n, _ in want["merged"]] == list(state)
        assert all(torch.equal(t, state[n]) for n, t in want["merged"])
    want_specs = {part: PolicyWeights(reference).specs(part) for part in PARTS}

    root = shard(adapter.model)
    weights = PolicyWeights(adapter.model, root)
    watch = Watch(root)
    assert watch.unsharded_now() == 0
    mismatches, compared = [], {}
    for part in PARTS:
        # the stream walks unit by unit (the root's tensors, then each block's), so its order is not the unsharded
        # model's; the specs announce that order and the tensors are the same, name by name
        specs = weights.specs(part)
        if sorted(specs, key=lambda s: s.name) != sorted(want_specs[part], key=lambda s: s.name):
            mismatches.append(f"{part}: specs differ from the unsharded model's")
        got = []
        for name, tensor in weights.stream(part):
            watch.look()
            got.append((name, tensor))
        if [s.name for s in specs] != [n for n, _ in got]:
            mismatches.append(f"{part}: the stream's order is not its specs'")
        names = [n for n, _ in got]
        reference = dict(want[part])
        if len(set(names)) != len(names) or set(names) != set(reference):
            mismatches.append(f"{part}: streamed {sorted(set(names) - set(reference))[:3]} never streamed "
                              f"{sorted(set(reference) - set(names))[:3]} ({len(names)} items)")
            continue
        for name, tensor in got:
            ref = reference[name]
            if isinstance(tensor, DTensor) or tensor.dtype != ref.dtype or not torch.equal(tensor, ref):
                mismatches.append(f"{part}: {name}")
        compared[part] = len(got)
    report = {"unshard_calls": watch.calls, "most_unsharded_by_calls": watch.most_by_calls,
              "most_unsharded_seen": watch.most_seen, "unsharded_after": watch.unsharded_now()}
    stream = weights.stream("merged")  # a consumer that stops after one tensor: its unit is resharded
    next(stream)
    stream.close()
    report["unsharded_after_abandoning"] = watch.unsharded_now()
    with gathered(root):  # the control: every unit gathered at once is seen by both counts
        report["control_seen"], report["control_by_calls"] = watch.unsharded_now(), len(watch.open)
    return {**report, "name": family + ("+lora" if lora else "") + ("+bf16" if dtype == torch.bfloat16 else ""),
            "units": len(watch.units), "compared": compared, "mismatches": mismatches}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cases = [run_case(*case) for case in CASES]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, cases)
    if rank == 0:
        merged = []
        for k, case in enumerate(everyone[0]):
            case = dict(case)
            for other_rank, other in enumerate(everyone[1:], start=1):  # the worst over the ranks
                other_case = other[k]
                case["mismatches"] += [f"rank {other_rank}: {m}" for m in other_case["mismatches"]]
                for key in ("most_unsharded_by_calls", "most_unsharded_seen", "unsharded_after",
                            "unsharded_after_abandoning"):
                    case[key] = max(case[key], other_case[key])
                for key in ("unshard_calls", "control_seen", "control_by_calls"):
                    case[key] = min(case[key], other_case[key])
            merged.append(case)
        with open(out, "w") as handle:
            json.dump({"cases": merged}, handle, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
