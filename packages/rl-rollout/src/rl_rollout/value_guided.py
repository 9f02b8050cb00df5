r"""Value-guided decoding (ILQL, Snell et al., arXiv 2206.11871) as a logits processor.

ILQL extracts its policy at decoding time by perturbing the behaviour model's distribution with
the learned advantage:

.. math:: \log\pi(a \mid s) \propto \log\pi_\beta(a \mid s) + \beta\,(Q(s, a) - V(s))

(ILQL Sec. 4, policy extraction; trlX's ``generate``: ``log_softmax(logits) + beta * (Q - V)``
with ``Q`` the minimum of the target Q heads, then top-k, then temperature). The Q and V heads
read the model's last hidden state, which a ``generate`` logits processor does not see, so
:class:`HiddenStateCapture` records the input of the model's output layer on every forward pass
(a forward pre-hook on ``get_output_embeddings()``) and :class:`ValueGuidedProcessor` applies
the heads to it. The processor is a :data:`rl_rollout.LogitsHook`: pass it as
``SamplingParams(logits_processor=...)`` to :class:`rl_rollout.HFEngine`, whose processing then
runs repetition penalty, ``logit_mask``, this hook, temperature, top-k and top-p in that order
(top-k before or after the temperature keeps the same tokens, so this equals trlX's order)::

    with value_guided_decoding(model, heads_fn, beta=1.0) as hook:
        params = SamplingParams(temperature=0.0, top_k=20, logits_processor=hook)
        result = engine.generate(prompts, params)

``heads_fn(hidden [B, H]) -> (q [B, V], v [B])`` is any callable; with rl-adapters' ``ILQLHeads``
it is ``lambda h: (heads.target_q(h), heads.values(h))``. Glossary: ``B`` rows being decoded
(prompts times samples), ``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "HeadsFn",
    "HiddenStateCapture",
    "ValueGuidedProcessor",
    "value_guided_decoding",
    "value_guided_logits",
]

#: ``hidden [B, H] -> (Q [B, V], V [B])``
HeadsFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def value_guided_logits(
    logits: torch.Tensor, q: torch.Tensor, v: torch.Tensor, beta: float = 1.0
) -> torch.Tensor:
    r"""ILQL's decoding scores :math:`\log\mathrm{softmax}(\ell) + \beta (Q - V)`.

    Entries of ``logits`` at ``-inf`` (masked tokens) stay ``-inf``. ``V`` shifts every score of
    a row by the same amount, so it changes neither the argmax nor the softmax; it is kept so the
    scores are trlX's exactly.

    Args:
        logits: [B, V] next-token logits of the behaviour model :math:`\pi_\beta`.
        q: [B, V] Q-values of every next token.
        v: [B] (or [B, 1]) state values.
        beta: Guidance strength :math:`\beta` (>= 0; 0 decodes :math:`\pi_\beta`).

    Returns:
        [B, V] scores in float32 (or the logits' dtype when wider).
    """
    if logits.ndim != 2:
        raise ValueError(f"`logits` must have shape [B, V], got shape {list(logits.shape)}")
    if q.shape != logits.shape:
        raise ValueError(
            f"`q` has shape {list(q.shape)} but `logits` has shape {list(logits.shape)}; they "
            "must match (are the Q heads sized for this model's vocabulary?)"
        )
    values = v.reshape(-1, 1) if v.ndim == 1 or (v.ndim == 2 and v.shape[1] == 1) else None
    if values is None or values.shape[0] != logits.shape[0]:
        raise ValueError(
            f"`v` must have shape [B] = [{logits.shape[0]}] (or [B, 1]), got shape {list(v.shape)}"
        )
    if not beta >= 0:
        raise ValueError(f"`beta` must be >= 0, got {beta}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scores = torch.log_softmax(logits.to(dtype), dim=-1)
    if beta == 0:
        return scores
    return scores + beta * (q.to(dtype) - values.to(dtype))


class HiddenStateCapture:
    """Records the hidden state fed to ``model``'s output layer on every forward pass.

    A forward pre-hook on ``model.get_output_embeddings()`` keeps the last position of its
    input: in incremental decoding that is the state of the token about to be sampled, i.e.
    exactly the hidden state the ``scores`` of the following logits-processor call come from.
    Use as a context manager (or call :meth:`close`) to remove the hook.

    Args:
        model: A transformers causal LM (its output layer is called on the final hidden
            states, after the final norm).
    """

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if not isinstance(head, torch.nn.Module):
            raise ValueError(
                f"cannot capture hidden states of {type(model).__name__}: it has no output "
                "embedding layer (get_output_embeddings)"
            )
        self.last: torch.Tensor | None = None
        self._handle = head.register_forward_pre_hook(self._record)

    def _record(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        del module
        hidden = args[0]
        if isinstance(hidden, torch.Tensor):
            self.last = hidden[:, -1] if hidden.ndim == 3 else hidden
            self.last = self.last.detach()

    def close(self) -> None:
        """Remove the hook."""
        self._handle.remove()

    def __enter__(self) -> HiddenStateCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ValueGuidedProcessor:
    """A :data:`rl_rollout.LogitsHook` returning :func:`value_guided_logits` of the scores.

    Args:
        heads_fn: ``hidden [B, H] -> (Q [B, V], V [B])``.
        capture: Where the current hidden states come from.
        beta: Guidance strength (>= 0).
    """

    def __init__(self, heads_fn: HeadsFn, capture: HiddenStateCapture, beta: float = 1.0) -> None:
        if not beta >= 0:
            raise ValueError(f"`beta` must be >= 0, got {beta}")
        self.heads_fn = heads_fn
        self.capture = capture
        self.beta = beta

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Scores [B, V] -> value-guided scores [B, V] (``input_ids`` [B, t] is unused)."""
        del input_ids
        hidden = self.capture.last
        if hidden is None:
            raise RuntimeError(
                "no hidden state was captured: generate with the model the HiddenStateCapture "
                "hooks (use `value_guided_decoding(model, ...)` around engine.generate)"
            )
        if hidden.shape[0] != scores.shape[0]:
            raise RuntimeError(
                f"captured hidden states have {hidden.shape[0]} rows but the scores have "
                f"{scores.shape[0]}: the capture is attached to another model"
            )
        with torch.no_grad():
            q, v = self.heads_fn(hidden)
        return value_guided_logits(scores, q.to(scores.device), v.to(scores.device), self.beta)


@contextlib.contextmanager
def value_guided_decoding(
    model: Any, heads_fn: HeadsFn, *, beta: float = 1.0
) -> Iterator[ValueGuidedProcessor]:
    """Hook ``model`` for the duration of the block and yield the processor to sample with.

    Args:
        model: The causal LM the engine generates with.
        heads_fn: ``hidden [B, H] -> (Q [B, V], V [B])``.
        beta: Guidance strength (>= 0).

    Yields:
        A :class:`ValueGuidedProcessor` for ``SamplingParams(logits_processor=...)``.
    """
    capture = HiddenStateCapture(model)
    try:
        yield ValueGuidedProcessor(heads_fn, capture, beta)
    finally:
        capture.close()
