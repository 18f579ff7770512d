"""The model calls every family shares: the kwargs of a prompt forward, of one teacher-forced forward over prompt +
completion, and of `generate` (suppressed ids, EOS, sampling, the cache decision)."""

from __future__ import annotations

from typing import Any

import torch

from vlm_grpo.adapters.batch import PromptBatch


class ModelCalls:
    """Mixed into VLMAdapter: model kwargs for forwards and `generate`."""

    def suppressed_token_ids(self) -> list[int]:
        """Ids the policy must never emit: a generated placeholder breaks the training forward."""
        return sorted({self.image_token_id, *self._extra_suppressed_ids()})

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id

    def model_inputs(self, batch: PromptBatch) -> dict[str, torch.Tensor]:
        """Model kwargs for a prompt batch; the one place a family can adjust them (generate and forward)."""
        return batch.model_inputs()

    def completion_inputs(self, batch: PromptBatch, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          completion_types: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Model kwargs for one teacher-forced forward over prompt + completion. `completion_types`: token-shaped
        values over the completion ([N, T] per key) where it shows images (tool turns); otherwise text (0)."""
        inputs = self.model_inputs(batch)
        inputs["input_ids"] = torch.cat([batch.input_ids, completion_ids], dim=1)
        inputs["attention_mask"] = torch.cat([batch.attention_mask, completion_mask.to(batch.attention_mask.dtype)], dim=1)
        types = completion_types or {}
        for key in dict.fromkeys([*batch.token_keys, *types]):
            prompt = batch.mm[key] if key in batch.mm else batch.input_ids.new_zeros(batch.input_ids.shape)
            tail = types[key].to(prompt) if key in types else self.completion_tail(key, prompt, completion_ids.shape[1])
            inputs[key] = torch.cat([prompt, tail], dim=1)
        return inputs

    def generate(self, batch: PromptBatch, **settings: Any):
        """Completions for `batch` with the suppressed ids and the cache decision (settings: `generation_kwargs`)."""
        with torch.no_grad():
            return self.model.generate(**self.model_inputs(batch), **self.generation_kwargs(**settings))

    def generation_kwargs(self, *, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
                          top_p: float = 1.0, top_k: int = 0, use_cache: bool | None = None, output_logits: bool = False,
                          min_new_tokens: int = 0, eos_token_id: list[int] | None = None,
                          sampler: str = "inverse_cdf", token_logps: Any = None) -> dict[str, Any]:
        """`generate()` settings of every generation path: suppression, EOS, sampling, and the cache decision
        unless `use_cache` forces one. `sampler` (with do_sample): "inverse_cdf" draws from generate()'s distribution
        with one uniform per row (adapters/sampler.py); "multinomial" is generate()'s own draw. `token_logps` (a
        sampler.TokenLogps, inverse_cdf only): gets each drawn token's log-prob at the sampling temperature."""
        from vlm_grpo.adapters.sampler import inverse_cdf_generation, sampler_draws  # transformers: only to generate
        eos = self.eos_token_ids if eos_token_id is None else eos_token_id
        if do_sample and sampler_draws(sampler, output_logits):
            greedy = self.generation_kwargs(max_new_tokens=max_new_tokens, use_cache=use_cache, eos_token_id=eos)
            return inverse_cdf_generation(greedy, self.model.generation_config, self.suppressed_token_ids(), eos,
                                          min_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                          token_logps=token_logps)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            # 0 as None: with any min_new_tokens, generate() masks EOS below a min_length (the prompt's, for 0), a
            # vocabulary-wide mask built at every step that never masks anything
            min_new_tokens=min_new_tokens or None,
            do_sample=do_sample,
            use_cache=(self.use_cache is not False) if use_cache is None else use_cache,
            suppress_tokens=self.suppressed_token_ids(),
            pad_token_id=self.pad_token_id,
            eos_token_id=eos,
            return_dict_in_generate=True,
            output_logits=output_logits,
        )
        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        kwargs.update(sampling if do_sample else dict.fromkeys(sampling))
        return kwargs
