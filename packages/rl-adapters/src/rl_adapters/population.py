"""Shared-base populations: N agents as LoRA adapters on one frozen base in memory.

AgileRL's ``population`` deep-copies the whole base per member; here the base exists once and
each member is an adapter (``agent_0`` ... ``agent_{N-1}``), so memory is about base + N
adapters. Each member gets its own optimizer over :meth:`SharedBasePopulation.parameters`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import PreTrainedModel

from rl_adapters.lora import default_lora_config, match_dropout_mode, validate_lora_config
from rl_adapters.policy import causal_lm_of, copy_adapter, decoder_of, is_lora_param_of
from rl_adapters.replay import replayable
from rl_adapters.seeding import seeded

__all__ = ["SharedBasePopulation"]


class SharedBasePopulation:
    """``size`` agents as LoRA adapters on one shared, frozen base.

    Args:
        model: A transformers causal LM, wrapped in place by peft.
        size: Number of agents (>= 1).
        lora_config: Config of every agent's adapter (None: the default, with a warning).
        seed: Seed of the adapters' initialisation (the global RNG is left untouched).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        size: int,
        *,
        lora_config: LoraConfig | None = None,
        seed: int = 0,
    ) -> None:
        if size < 1:
            raise ValueError(f"`size` must be >= 1, got {size}")
        config = (
            validate_lora_config(lora_config, model)
            if lora_config is not None
            else default_lora_config(model)
        )
        training = model.training
        with seeded(seed, model):  # the adapters are built where the model lives
            peft_model = get_peft_model(model, config, adapter_name="agent_0")
            if not isinstance(peft_model, PeftModel):  # pragma: no cover - peft contract
                raise TypeError("get_peft_model did not return a PeftModel")
            for i in range(1, size):
                peft_model.add_adapter(self.adapter_name(i), copy.deepcopy(config))
        match_dropout_mode(peft_model, training)  # peft builds LoRA dropout in training mode
        self.peft = peft_model
        self.size = size
        self.lora_config = config
        self._active = 0
        self._restore(0)

    @staticmethod
    def adapter_name(index: int) -> str:
        """The adapter name of agent ``index``."""
        return f"agent_{index}"

    def _check(self, index: int) -> None:
        if not 0 <= index < self.size:
            raise ValueError(f"agent index must be in [0, {self.size}), got {index}")

    def _restore(self, index: int) -> None:
        self.peft.set_adapter(self.adapter_name(index))
        self._active = index
        for name, param in self.peft.named_parameters():
            param.requires_grad_(".lora_" in name)

    @contextlib.contextmanager
    def member(self, index: int) -> Iterator[None]:
        """Run the body with agent ``index``'s adapter; restore the previous one after."""
        self._check(index)
        previous = self._active
        try:
            self.peft.set_adapter(self.adapter_name(index))
            self._active = index
            yield
        finally:
            self._restore(previous)

    def parameters(self, index: int) -> list[nn.Parameter]:
        """Agent ``index``'s trainable parameters (for its own optimizer)."""
        self._check(index)
        name = self.adapter_name(index)
        return [p for n, p in self.peft.named_parameters() if is_lora_param_of(n, name)]

    def clone(self, source: int, target: int) -> None:
        """Copy agent ``source``'s adapter onto agent ``target`` exactly (tournament step)."""
        self._check(source)
        self._check(target)
        copy_adapter(self.peft, self.adapter_name(source), self.adapter_name(target))
        self._restore(self._active)

    def hidden_states(
        self, index: int, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """[N, T, H] agent ``index``'s last hidden states."""
        causal_lm = causal_lm_of(self.peft)
        with replayable(functools.partial(self.member, index)):  # rl_adapters.replay
            out = decoder_of(causal_lm)(input_ids=input_ids, attention_mask=attention_mask)
        hidden = out.last_hidden_state
        assert isinstance(hidden, torch.Tensor)
        return hidden

    def logits(
        self, index: int, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """[N, T, V] agent ``index``'s logits."""
        head = causal_lm_of(self.peft).get_output_embeddings()
        assert isinstance(head, nn.Module)
        out = head(self.hidden_states(index, input_ids, attention_mask))
        assert isinstance(out, torch.Tensor)
        return out
