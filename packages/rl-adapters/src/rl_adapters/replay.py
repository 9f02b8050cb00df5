"""Forward state that activation checkpointing replays: one mechanism for every switch.

A forward can read state that a ``with`` block sets and restores: the active LoRA role
(:meth:`rl_adapters.PolicyModel.use_role`), the attention implementation of a packed forward
(``rl_algos.packing``), the lean forwards swapped into the model (rotary, RMSNorm, SwiGLU,
LoRA), the training flag that makes a layer checkpoint. With activation checkpointing, autograd
runs each checkpointed layer's forward a second time during the backward, usually after the
block has exited; a recomputation that reads the restored state computes another function
(torch's ``CheckpointError`` when it saves other tensors, silently wrong gradients when it
saves the same ones).

The rule: every such switch is entered through :func:`replayable`, which records the switch
(a zero-argument callable that returns a fresh context manager) on a per-thread stack for the
length of the block. The checkpoint function :func:`enable_checkpointing` installs on a model's
layers is :func:`replayed_checkpoint`: it takes the stack as it is when the layer runs forward
(where the switches are in effect already) and enters those switches again, outermost first,
around the recomputation (reentrant ``torch.utils.checkpoint.checkpoint``, whose backward calls
the layer again). So the recomputed forward sees exactly the state of the original one,
whatever the backward's own state is. :func:`checkpoint_context` does the same for the
non-reentrant checkpoint (``context_fn=``), the other choice of :func:`enable_checkpointing`.

Contract of a switch ``enter``: ``enter()`` returns a new context manager each call; entering
it sets the state absolutely (not relative to what is set), and entering it while the same
state is already set is harmless (e.g. a swap that skips what is already swapped). Saved-tensor
hooks (``torch.autograd.graph.save_on_cpu``, activation offload) are not switches: torch's
recomputation installs its own hooks, and replaying an offload hook inside them would hide the
recomputed tensors from the checkpoint.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "Switch",
    "checkpoint_context",
    "drop_input_require_grads",
    "enable_checkpointing",
    "recorded",
    "replayable",
    "replayed_checkpoint",
]

T = TypeVar("T")

#: A switch: a zero-argument callable returning a fresh context manager that sets the state.
Switch = Callable[[], AbstractContextManager[Any]]


class _Stack(threading.local):
    def __init__(self) -> None:
        self.switches: list[Switch] = []


_STACK = _Stack()


@contextlib.contextmanager
def replayable(enter: Callable[[], AbstractContextManager[T]]) -> Iterator[T]:
    """Enter ``enter()`` for the block, recorded so that a checkpointed recomputation replays it.

    Yields what ``enter()``'s context manager yields. Use it for every context manager that
    changes state a model's forward reads (module docstring).
    """
    with enter() as value:
        _STACK.switches.append(enter)
        try:
            yield value
        finally:
            _STACK.switches.pop()


def recorded() -> tuple[Switch, ...]:
    """The switches in effect on this thread, outermost first."""
    return tuple(_STACK.switches)


class _Replay:
    """Enters the recorded ``switches`` (outermost first) around one recomputation."""

    def __init__(self, switches: tuple[Switch, ...]) -> None:
        self.switches = switches
        self._open: list[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        try:
            for enter in self.switches:
                stack.enter_context(enter())
        except BaseException:
            stack.close()
            raise
        self._open.append(stack)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        return bool(self._open.pop().__exit__(kind, value, traceback))


def checkpoint_context() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
    """``torch.utils.checkpoint``'s ``context_fn``: ``(forward context, recomputation context)``.

    Called when a checkpointed layer runs forward: the forward runs as is, the recomputation
    inside the switches recorded at that moment (:func:`replayable`).
    """
    return contextlib.nullcontext(), _Replay(recorded())


def replayed_checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """Reentrant ``torch.utils.checkpoint.checkpoint`` of ``function(*args)``, with replayed state.

    The switches in effect now (:func:`recorded`) are entered again around ``function`` in the
    recomputation that the backward runs (with autograd on; the checkpoint's own forward runs
    without it, inside the switches already). The forward saves only ``args``, so no
    saved-tensor hook runs per operation (the non-reentrant checkpoint's cost on small layers,
    ``docs/benchmarks.md``).

    A reentrant checkpoint is differentiated only where one of its inputs requires grad. Where
    none does (the first layer over frozen embeddings, with autograd on), an empty anchor tensor
    that requires grad is passed along instead: the layer's parameters get their gradients and
    no gradient of its input is computed, as without checkpointing. Where the layer has no
    trainable parameter either, the recomputed output is tied to the anchor (``+ anchor.sum()``,
    an exact zero), so the backward has a graph to run.
    """
    replay = _Replay(recorded())
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    anchored = torch.is_grad_enabled() and not any(t.requires_grad for t in tensors)

    def run(*inner: Any) -> Any:
        layer_args = inner[1:] if anchored else inner
        if not torch.is_grad_enabled():  # the checkpoint's forward: the switches are in effect
            return function(*layer_args)
        with replay:  # the recomputation, during the backward
            out = function(*layer_args)
        return _tied(out, inner[0]) if anchored else out

    if anchored:
        device = tensors[0].device if tensors else None
        anchor = torch.empty(0, device=device, requires_grad=True)
        return checkpoint(run, anchor, *args, use_reentrant=True)
    return checkpoint(run, *args, use_reentrant=True)


def _tied(out: Any, anchor: torch.Tensor) -> Any:
    """``out`` (a tensor or a tuple led by one), tied to ``anchor`` where it needs no grad."""
    first = out[0] if isinstance(out, tuple) else out
    if not isinstance(first, torch.Tensor) or first.requires_grad:
        return out
    first = first + anchor.sum().to(first.dtype)  # an empty sum: exactly zero
    return (first, *out[1:]) if isinstance(out, tuple) else first


def enable_checkpointing(model: nn.Module, reentrant: bool = True) -> None:
    """Turn on activation checkpointing of a transformers model's layers, with replayed state.

    With ``reentrant`` (the default) each checkpointed layer calls :func:`replayed_checkpoint`
    (``model._rl_checkpoint`` says ``"reentrant"``). Without it,
    non-reentrant ``torch.utils.checkpoint.checkpoint`` with ``context_fn=``
    :func:`checkpoint_context` (``"non-reentrant"``). Either replaces a checkpoint function set
    before (peft's k-bit preparation sets a reentrant one that replays nothing).

    Neither needs the input embeddings' output to require grad (the reentrant one carries its
    graph on an anchor, :func:`replayed_checkpoint`), so the hook transformers registers for
    that (``enable_input_require_grads``) is removed again: the first layer computes no input
    gradient over frozen embeddings, as without checkpointing. peft registers the same hook when
    it wraps a checkpointed model; :func:`drop_input_require_grads` removes it.

    Raises:
        ValueError: A model that does not support gradient checkpointing (names the class).
        RuntimeError: ``reentrant`` where transformers installed no per-layer checkpoint function
            to replace (a transformers version this was not written for).
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"gradient_checkpointing=True: {type(model).__name__} does not support activation "
            "checkpointing; pass gradient_checkpointing=False"
        )
    kwargs = {"use_reentrant": False, "context_fn": checkpoint_context}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    drop_input_require_grads(model)
    model._rl_checkpoint = "non-reentrant"  # type: ignore[assignment]
    if not reentrant:
        return
    layers = [m for m in model.modules() if getattr(m, "_gradient_checkpointing_func", None)]
    if not layers:
        raise RuntimeError(
            f"enable_checkpointing: transformers set no `_gradient_checkpointing_func` on "
            f"{type(model).__name__}'s layers; pass reentrant=False"
        )
    for layer in layers:
        layer._gradient_checkpointing_func = replayed_checkpoint  # type: ignore[assignment]
    model._rl_checkpoint = "reentrant"  # type: ignore[assignment]


def drop_input_require_grads(model: nn.Module) -> None:
    """Remove the embeddings' hook that ``enable_input_require_grads`` registered last.

    transformers registers it when checkpointing is enabled, peft again when it wraps a
    checkpointed model (each call forgets the handles of the one before, so this runs after
    each). A no-op where there is none, or where transformers lacks
    ``disable_input_require_grads``.
    """
    disable = getattr(model, "disable_input_require_grads", None)
    if disable is not None:
        disable()
