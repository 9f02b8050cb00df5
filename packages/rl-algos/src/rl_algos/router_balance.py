"""The load-balancing loss of a mixture-of-experts policy, per sequence.

A transformers MoE model routes each token to ``k`` of ``E`` experts in every MoE layer. The
auxiliary loss of Switch Transformers (Fedus et al., 2021, eqs. 4-6), as transformers'
``load_balancing_loss_func`` computes it over a set of tokens ``S`` (every layer's routing of
them):

    aux(S) = E * sum_i F_i * P_i,
    F_i = (1 / |S|) * sum_{t in S} [i in topk(p_t)],   P_i = (1 / |S|) * sum_{t in S} p_{t,i},

with ``p_t = softmax(router_logits_t)``. TRL and OpenRLHF take ``S`` to be each forward's
tokens, so the loss changes with how rows are batched. Here ``S`` is one sequence's tokens
(its attention-mask positions, all MoE layers), the sequence-wise form of DeepSeek-V3's
complementary balance loss, and the agents add ``coef * sum_r aux(S_r) / R`` over the ``R``
rows with an action token in the minibatch (:attr:`rl_algos.batch.Normalizers.sequences`): a
row's tokens are always in one forward, so the loss is the same packed or padded, with shared
prompts (a shared token counts in each row that holds it), in any micro-batches and on any
number of processes. For a forward of one sequence it is transformers' (and TRL's) value.

The router logits are read where transformers declares them (``_can_record_outputs
["router_logits"]``, an ``OutputRecorder`` of the router module class) with forward hooks,
during the training forward of the actor only; a forward that activation checkpointing
recomputes in the backward is not read again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_adapters.replay import enable_checkpointing

__all__ = [
    "RouterBalance",
    "build_router_balance",
    "router_module_class",
    "sequence_balance_loss",
]


def _text_config(model: Any) -> Any:
    config: Any = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def router_module_class(model: torch.nn.Module) -> tuple[type[torch.nn.Module], int] | None:
    """``(router class, index of the logits in its output)`` that ``model`` declares, or None.

    transformers' MoE models declare the module whose output holds the router logits in
    ``_can_record_outputs["router_logits"]`` (an ``OutputRecorder``); a dense model has none.
    """
    for module in model.modules():
        recorder = getattr(type(module), "_can_record_outputs", None)
        spec = recorder.get("router_logits") if isinstance(recorder, dict) else None
        target = getattr(spec, "target_class", None)
        if isinstance(target, type) and issubclass(target, torch.nn.Module):
            return target, int(getattr(spec, "index", 0))
    return None


def experts_per_token(model: Any) -> int:
    """``k``: experts routed per token (``num_experts_per_tok`` of the text config)."""
    k = getattr(_text_config(model), "num_experts_per_tok", None)
    if not isinstance(k, int) or k < 1:
        raise ValueError(
            f"{type(model).__name__} declares router logits but no num_experts_per_tok in its "
            "config: pass router_aux_loss_coef=0.0"
        )
    return k


def sequence_balance_loss(
    router_logits: torch.Tensor,
    attention_mask: torch.Tensor,
    top_k: int,
    routes: torch.Tensor | None = None,
) -> torch.Tensor:
    """[N] ``aux(S_r)`` of each row (module docstring), 0 for a row without a token.

    Args:
        router_logits: [N, L, Y, E] each position's router logits in each of the ``Y`` MoE
            layers (not shifted: position ``t`` is token ``t``).
        attention_mask: [N, L], True (or 1) on the row's tokens.
        top_k: Experts routed per token.
        routes: [N, L, Y, k] the experts the forward routed each token to when they are not
            the top-k of ``router_logits`` (routing replay, :mod:`rl_algos.router_replay`; -1
            where a position was not replayed): ``F_i`` counts them, as Megatron-LM counts the
            replayed routing map. None: the top-k.
    """
    if router_logits.dim() != 4 or router_logits.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"router_logits {tuple(router_logits.shape)} must be [N, L, Y, E] over "
            f"attention_mask {tuple(attention_mask.shape)}"
        )
    E = router_logits.shape[-1]
    probs = torch.softmax(router_logits.float(), dim=-1)  # [N, L, Y, E]
    chosen = torch.topk(probs.detach(), top_k, dim=-1).indices
    if routes is not None:
        if routes.shape != chosen.shape:
            raise ValueError(
                f"routes {tuple(routes.shape)} must be [N, L, Y, k] = {tuple(chosen.shape)}"
            )
        replayed = (routes >= 0).all(dim=-1, keepdim=True)
        chosen = torch.where(replayed, routes.long(), chosen)
    counts = torch.zeros_like(probs).scatter_(-1, chosen, 1.0)  # [N, L, Y, E], k ones
    weight = attention_mask.to(probs.dtype)[:, :, None, None]
    tokens = (weight.sum(dim=(1, 2, 3)) * probs.shape[2]).clamp(min=1.0)  # |S_r|: L_r * Y
    f = (counts * weight).sum(dim=(1, 2)) / tokens[:, None]  # [N, E]
    p = (probs * weight).sum(dim=(1, 2)) / tokens[:, None]
    return E * (f * p).sum(dim=-1)


@dataclass
class RouterBalance:
    """The load-balancing loss's weight and the hooks that read the actor's router logits.

    Inside :meth:`training` (the loss function of an update), each training forward of the
    actor runs inside :meth:`recording`: the hooks collect each router call's logits (flat
    ``[S, E]``, one call per MoE layer), :meth:`attach` appends them to the forward's hidden
    states as ``Y * E`` more columns, so that every layout (packed, padded, shared prompts) lays
    them out per row exactly as it does the hidden states, and :meth:`detach` takes them off
    again, kept for :meth:`term` ([N, L, Y, E] per row).
    """

    model: torch.nn.Module
    coef: float
    top_k: int
    _calls: list[torch.Tensor] = field(default_factory=list)
    _recording: bool = False
    _training: bool = False
    _rows: torch.Tensor | None = None
    _experts: int = 0
    _width: int = 0
    _handles: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        found = router_module_class(self.model)
        if found is None:
            raise ValueError(
                f"{type(self.model).__name__} declares no router logits "
                "(_can_record_outputs['router_logits']): not a mixture-of-experts model"
            )
        router, index = found

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            del module, args
            if self._recording:
                logits = output[index] if isinstance(output, tuple) else output
                self._calls.append(logits.reshape(-1, logits.shape[-1]))

        self._handles = [
            m.register_forward_hook(hook) for m in self.model.modules() if isinstance(m, router)
        ]

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """The actor's forwards inside are training forwards: their router logits are read."""
        self._training, self._rows = True, None
        try:
            yield
        finally:
            self._training = False

    @property
    def reads(self) -> bool:
        """Inside :meth:`training`: the actor's next forward is recorded."""
        return self._training

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Collect the router calls of the one forward inside."""
        self._calls, self._recording = [], True
        try:
            yield
        finally:
            self._recording = False

    def attach(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [B, S, H] with the recorded router logits appended: [B, S, H + Y * E]."""
        calls, self._calls = self._calls, []
        positions = hidden.shape[0] * hidden.shape[1]
        if not calls or any(c.shape[0] != positions for c in calls):
            raise RuntimeError(
                f"router logits of {[c.shape[0] for c in calls]} positions recorded in a "
                f"forward of {positions}"
            )
        self._experts = calls[0].shape[-1]
        logits = torch.cat(calls, dim=-1).to(hidden.dtype)
        self._width = logits.shape[-1]
        return torch.cat([hidden, logits.view(*hidden.shape[:2], -1)], dim=-1)

    def detach(self, laid_out: torch.Tensor) -> torch.Tensor:
        """The hidden states [N, L, H] of ``laid_out`` [N, L, H + Y * E]; keeps the rest."""
        hidden_size = laid_out.shape[-1] - self._width
        self._rows = laid_out[..., hidden_size:]
        return laid_out[..., :hidden_size]

    def term(
        self,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        rows: float,
        coef: float,
        routes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float]:
        """The loss term of the last recorded forward, and its mean per row.

        ``coef * sum_r aux(S_r) / rows`` over the forward's rows with an action (``mask`` [N, T]
        has a True), where ``rows`` counts those of the whole minibatch on every process
        (:attr:`rl_algos.batch.Normalizers.sequences`): the micro-batches' terms add up to the
        minibatch's.

        Args:
            attention_mask: [N, L] of the forward.
            mask: [N, T] the action mask (shifted by one).
            rows: The minibatch's rows with an action, all processes.
            coef: The weight (``router_aux_loss_coef``).
            routes: [N, L, Y, k] the replayed routes of the forward, or None
                (:func:`sequence_balance_loss`).
        """
        if self._rows is None:
            raise RuntimeError("no router logits were recorded in this update's forward")
        logits, self._rows = self._rows, None
        per_row = sequence_balance_loss(
            logits.reshape(*logits.shape[:2], -1, self._experts), attention_mask, self.top_k,
            routes,
        )  # fmt: skip
        acting = mask.any(dim=1)
        per_row = torch.where(acting, per_row, torch.zeros((), dtype=per_row.dtype))
        mean = float(per_row.detach().sum()) / max(int(acting.sum()), 1)
        return coef * per_row.sum() / max(rows, 1.0), mean

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def build_router_balance(
    agent: str, coef: float | None, model: torch.nn.Module
) -> RouterBalance | None:
    """The load-balancing loss of ``agent`` (its class name) on ``model``, or None (off).

    ``coef`` None takes the model config's ``router_aux_loss_coef`` on a mixture-of-experts
    model (TRL's default) and means off on a dense one; 0.0 is off. With the loss on, a model
    with reentrant activation checkpointing switches to the non-reentrant checkpoint
    (:func:`rl_adapters.replay.enable_checkpointing`).

    Raises:
        ValueError: ``coef > 0`` on a model that declares no router logits.
    """
    if router_module_class(model) is None:
        if coef:
            raise ValueError(
                f"{agent}(router_aux_loss_coef={coef}): {type(model).__name__} is not a "
                "mixture-of-experts model (it declares no router logits), so there is no "
                "load-balancing loss to weight; leave router_aux_loss_coef unset"
            )
        return None
    if coef is None:
        coef = float(getattr(_text_config(model), "router_aux_loss_coef", 0.0) or 0.0)
    if coef == 0.0:
        return None
    if getattr(model, "_rl_checkpoint", None) == "reentrant":
        # the reentrant checkpoint runs a layer's forward without autograd: router logits read
        # there would carry no gradient, the non-reentrant one's do
        enable_checkpointing(model, reentrant=False)
    return RouterBalance(model, float(coef), experts_per_token(model))
