"""Weights checked after every optimizer update: a step that leaves a weight NaN or inf is undone.

The loss and gradient guards (optimizer.update_step) catch most bad steps before they are applied, but a finite
gradient times an absurd step size (a learning rate of 1e308, SGD without clipping) still writes inf into the
weights, and every later step then trains on NaN. So after each update every optimizer group's largest |weight| is taken
(its max norm: one small reduction per group, one sync for all) and, if any is not finite:
- `keep_previous` (guard.undo_nonfinite_updates true): the tensors the optimizer stepped and its state
  (AdamW's moments and step counts) are put back from a copy taken just before the step, so the model and the
  optimizer are exactly as before it; the step counts as skipped and the run goes on (NonFiniteGuard stops it after
  guard.max_nonfinite_steps such steps in a row). The copy costs memory: the stepped tensors and the optimizer
  state once more, on their device;
- otherwise (the default) the step cannot be undone: the run stops at once (TrainingHalted) and the newest checkpoint on disk is
  the last good state.
"""

from __future__ import annotations

from typing import Any

import torch

from vlm_grpo.grpo.guards.protocol import TrainingHalted


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard: its own part is what this process holds


class WeightGuard:
    def __init__(self, optimizer: torch.optim.Optimizer, keep_previous: bool = False):
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds torch's optimizer
        self.keep_previous = keep_previous
        self._params: list[torch.Tensor] = []
        self._copies: list[torch.Tensor] = []
        self._state: dict[int, dict[str, Any]] | None = None
        self.stepped = False  # whether the optimizer stepped since the last check
        self.optimizer.register_step_pre_hook(lambda *_: self._before_step())

    def _before_step(self) -> None:
        self.stepped = True
        if not self.keep_previous:
            return
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if [id(p) for p in params] != [id(p) for p in self._params]:  # first step, or new groups: new buffers
            self._params = params
            self._copies = [torch.empty_like(_local(p.detach())) for p in params]
        with torch.no_grad():
            torch._foreach_copy_(self._copies, [_local(p.detach()) for p in params])
        self._state = {id(p): {k: v.detach().clone() if torch.is_tensor(v) else v
                               for k, v in self.optimizer.state[p].items()}
                       for p in params if p in self.optimizer.state}

    def nonfinite_groups(self) -> dict[str, float]:
        """{group name: its largest |weight|} of the groups whose weights are not all finite after the last step."""
        groups = self.optimizer.param_groups
        norms = []
        for group in groups:
            local = [_local(p.detach()) for p in group["params"]]
            # the largest |weight| (the max norm): NaN and inf show, and unlike a 2-norm it cannot overflow
            largest = (torch.stack([n.float() for n in torch._foreach_norm(local, float("inf"))]).max() if local
                       else torch.zeros(()))
            if any(hasattr(p, "to_local") for p in group["params"]):  # sharded: every process must judge alike
                torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
            norms.append(largest)
        values = torch.stack([n.detach().cpu() for n in norms]).tolist() if norms else []  # one sync for all groups
        return {g.get("name", f"group {k}"): v for k, (g, v) in enumerate(zip(groups, values))
                if not torch.isfinite(torch.tensor(v))}

    def check(self, step: int | None = None) -> dict[str, float]:
        """After an update: {} when every weight is finite; else the bad groups, the step undone (or TrainingHalted
        when no copy was kept)."""
        if not self.stepped:
            return {}
        self.stepped = False
        bad = self.nonfinite_groups()
        if not bad:
            return {}
        what = ", ".join(f"{name} (largest |weight| {norm})" for name, norm in bad.items())
        at = f"step {step}: " if step is not None else ""
        if not self.keep_previous:
            raise TrainingHalted(f"{at}the update made weights non-finite in {what} and cannot be undone "
                                 "(guard.undo_nonfinite_updates false): stopped; the newest checkpoint is the last "
                                 "good state; lower optim.learning_rate")
        self.undo()
        return bad

    @torch.no_grad()
    def undo(self) -> None:
        """The stepped tensors and the optimizer's state as they were before the last step."""
        torch._foreach_copy_([_local(p.detach()) for p in self._params], self._copies)
        state = self._state or {}
        for p in self._params:
            if id(p) in state:
                for k, v in state[id(p)].items():
                    current = self.optimizer.state[p].get(k)
                    if torch.is_tensor(v) and torch.is_tensor(current):
                        current.copy_(v)
                    else:
                        self.optimizer.state[p][k] = v
            else:  # the first step made it: no state before
                self.optimizer.state.pop(p, None)
