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
length of the block. The checkpoint function :func:`enable_checkpointing` installs on a model
is ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False,
context_fn=checkpoint_context)``; :func:`checkpoint_context` runs when a checkpointed layer
runs forward, takes the stack as it is then, and returns a recomputation context that enters
each recorded switch again, outermost first, around the recomputation, and leaves them in
reverse order. So the recomputed forward sees exactly the state of the original one, whatever
the backward's own state is.

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

from torch import nn

__all__ = ["Switch", "checkpoint_context", "enable_checkpointing", "recorded", "replayable"]

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


def enable_checkpointing(model: nn.Module) -> None:
    """Turn on activation checkpointing of a transformers model's layers, with replayed state.

    Non-reentrant ``torch.utils.checkpoint.checkpoint`` with ``context_fn=``
    :func:`checkpoint_context`; replaces a checkpoint function set before (peft's k-bit
    preparation sets a reentrant one, which cannot replay anything).

    Raises:
        ValueError: A model that does not support gradient checkpointing (names the class).
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
