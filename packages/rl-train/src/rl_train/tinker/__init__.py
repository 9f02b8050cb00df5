"""A Tinker-compatible service: the official ``tinker`` SDK trains and samples on this stack.

``rl-train tinker-server --model DIR --api-key tml-...`` serves the REST API of the ``tinker``
SDK release pinned by the ``rl-train[tinker]`` extra on loopback: LoRA training clients on one
base model (each its own adapter and AdamW), ``forward_backward`` with Tinker's named losses
mapped onto rl-losses (:mod:`rl_train.tinker.losses`), ``optim_step``, sampling with the
log-probs of the distribution sampled from, and checkpoints in safetensors + JSON. The modules:

* :mod:`rl_train.tinker.app`: the routes (FastAPI) and :class:`ServerConfig`;
* :mod:`rl_train.tinker.futures`: the queue behind the SDK's futures;
* :mod:`rl_train.tinker.state`: the base model, adapters and optimizers;
* :mod:`rl_train.tinker.losses`: Tinker loss -> rl-losses function and arguments;
* :mod:`rl_train.tinker.sampling`: sampling with its log-probs;
* :mod:`rl_train.tinker.checkpoints`: ``save_state`` / ``load_state`` / sampler weights;
* :mod:`rl_train.tinker.wire`: the SDK's protobuf messages.

Nothing here is imported by ``import rl_train``; the extra's packages are needed only when the
server is built (:func:`require_extra` names the extra when one is missing).
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA_MISSING", "require_extra"]

#: The one-line error when the ``tinker`` extra is not installed.
EXTRA_MISSING = (
    "the Tinker server needs the `tinker` extra: pip install 'rl-train[tinker]' "
    "(missing: {missing})"
)


def require_extra() -> None:
    """``ImportError`` naming ``rl-train[tinker]`` if tinker, fastapi or uvicorn is missing."""
    missing = [m for m in ("tinker", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(EXTRA_MISSING.format(missing=", ".join(missing)))
