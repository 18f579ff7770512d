"""Parameter groups every family shares, from its `module_layout`: which module group (and training sub-group) a
parameter belongs to, the check that every parameter is in exactly one, and the routers' auxiliary-loss weight."""

from __future__ import annotations

from vlm_grpo.adapters.module_groups import group_parameters


class ParameterGroups:
    """Mixed into VLMAdapter: parameters by module group."""

    def module_group_of(self, name: str) -> str:
        return self.module_layout.group_of(name, self.family)

    def module_groups(self) -> dict[str, list[str]]:
        """group -> parameter names; every parameter belongs to exactly one group."""
        return group_parameters(self.module_layout, self.model, self.family)

    def training_group_of(self, name: str) -> str:
        """A parameter's sub-group where it has one (`experts`), else its module group: what freezing and
        per-group learning rates go by."""
        return self.module_layout.training_group_of(name, self.family)

    def router_aux_loss_coef(self, override: float | None = None) -> float:
        """Weight of the mixture-of-experts routers' load-balancing loss in the training loss, by TRL's rule: a
        model whose text config declares `output_router_logits` has routers; `override` (a run setting) or else
        the config's `router_aux_loss_coef` weighs their loss. 0.0: none to add."""
        text = self.model.config.get_text_config()
        if not hasattr(text, "output_router_logits"):
            if override:
                raise ValueError(f"router_aux_loss_coef={override}, but {self.family} is not a mixture-of-experts "
                                 "model that returns router logits: there is no auxiliary loss to weigh")
            return 0.0
        return float(getattr(text, "router_aux_loss_coef", 0.0) if override is None else override)

    def check_module_groups(self) -> None:
        """Raise (one line naming the parameters) unless every parameter is in exactly one group."""
        self.module_groups()
