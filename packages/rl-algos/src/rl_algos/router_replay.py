"""Routing replay of a mixture-of-experts policy: recorded experts forced in training (R2, R3).

A transformers MoE model routes each token to the ``k`` experts of highest router score in
every MoE layer. The update's forwards choose again, so after an optimizer step (the second
minibatch, the second epoch) a token can go through other experts than in the forward that
scored its old log-prob, and the ratio ``pi_theta / pi_old`` then also measures the jump of a
discrete choice, not only the change of the weights. Routing replay (Ma et al., 2025,
"Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers"; verl's
and ms-swift's ``R2``) records the top-k expert indices of every token in every MoE layer in
the forward that scores ``old_logprobs``, and forces the same indices in the update forwards.
Only the discrete choice is replayed: the router's scores of the forced experts are computed
from the current router weights (the value ``torch.topk`` would return at those indices), so
the router still gets its gradient. ``R3`` (rollout routing replay) forces the experts the
sampler chose instead (:mod:`rl_rollout.routes`, recorded by ``HFEngine(record_routes=True)``)
in the forward that scores the old log-probs and in the update's: the trainer then also routes
as the sampler did, whose numerics (a KV cache, merged LoRA weights, other batch shapes) can
choose other experts for the same token.

Mechanism: the router modules transformers declares (``_can_record_outputs
["router_logits"]``, :func:`rl_algos.router_balance.router_module_class`) choose their experts
with one ``torch.topk`` call; inside a router's forward a ``TorchFunctionMode`` answers that
call (records its indices, or returns the recorded ones with the gathered values). A router
that calls ``torch.topk`` another number of times, with another ``k`` or on another shape is
refused with its class name. Each layout of a forward (padded, uniform rows, packed) names the
row position ``m * L + t`` of each of its flat positions (:meth:`RouterReplay.laid_out`), so
routes recorded in one layout replay in any other; the switch is :func:`rl_adapters.replay.
replayable`, so a checkpointed layer recomputes with the same routes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_adapters.replay import replayable
from torch.overrides import TorchFunctionMode

from rl_algos.router_balance import experts_per_token, router_module_class

__all__ = ["RouterReplay", "build_router_replay", "laid_out", "replaying"]

#: Dtype of recorded routes (expert indices, -1 where nothing was recorded).
ROUTE_DTYPE = torch.int16


class _TopK(TorchFunctionMode):
    """Answers the one ``torch.topk`` of a router's forward (record or replay)."""

    def __init__(self, replay: RouterReplay, layer: int, router: str) -> None:
        super().__init__()
        self.replay, self.layer, self.router, self.calls = replay, layer, router, 0

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func not in (torch.topk, torch.Tensor.topk):
            return func(*args, **kwargs)
        self.calls += 1
        scores: torch.Tensor = args[0]
        k = args[1] if len(args) > 1 else kwargs.get("k")
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        r = self.replay
        index = r._index
        if (
            self.calls > 1
            or k != r.top_k
            or scores.dim() != 2
            or dim not in (-1, 1)
            or index is None
            or scores.shape[0] != index.shape[0]
        ):
            raise RuntimeError(
                f"router_replay: {self.router} chose its experts with a torch.topk this replay "
                f"does not know (call {self.calls}, k={k}, scores "
                f"{tuple(scores.shape)}, dim={dim}; expected one call, k={r.top_k}, scores "
                f"[S, E] over the forward's {None if index is None else index.shape[0]} "
                "positions): pass router_replay=None for this model"
            )
        live = func(*args, **kwargs)
        routes = r._routes
        assert routes is not None
        if r._mode == "record":
            routes[index, self.layer] = live.indices.to(routes.dtype)
            return live
        forced = routes[index, self.layer].long()  # [S, k]
        known = (forced >= 0).all(dim=-1)  # padding was not recorded: its own choice
        chosen = torch.where(known[:, None], forced, live.indices)
        flipped = (chosen.sort(-1).values != live.indices.sort(-1).values).any(-1) & known
        r._flips[self.layer] = (flipped.sum(), known.sum())  # read by flips(): no sync here
        return torch.return_types.topk((scores.gather(-1, chosen), chosen))


@dataclass
class RouterReplay:
    """Records the actor's routes in the old-log-prob forward and forces them in the update.

    :meth:`recording` (around the scoring forward) and :meth:`replaying` (around an update
    forward, with the rows' recorded routes) set the mode; within them, the forward's layout
    names its positions with :func:`laid_out`. Routes are ``[M, L, Y, k]`` (``Y`` MoE layers,
    not shifted: position ``t`` is token ``t``), -1 off the attention mask.
    """

    model: torch.nn.Module
    top_k: int
    mode: str = "R2"
    """``"R2"``: the old forward records the routes; ``"R3"``: the sampler's are replayed."""
    _layers: int = 0
    _mode: str | None = None
    _routes: torch.Tensor | None = None
    _index: torch.Tensor | None = None
    _flips: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        found = router_module_class(self.model)
        if found is None:
            raise ValueError(
                f"{type(self.model).__name__} declares no router "
                "(_can_record_outputs['router_logits']): not a mixture-of-experts model"
            )
        routers = [m for m in self.model.modules() if isinstance(m, found[0])]
        self._layers = len(routers)
        for layer, module in enumerate(routers):
            modes: list[_TopK] = []

            def pre(
                module: torch.nn.Module, args: Any, layer: int = layer, modes: Any = modes
            ) -> None:
                del args
                if self._mode is not None and self._index is not None:
                    mode = _TopK(self, layer, type(module).__name__)
                    mode.__enter__()
                    modes.append(mode)

            def post(module: torch.nn.Module, args: Any, output: Any, modes: Any = modes) -> None:
                del args, output
                if modes:
                    mode = modes.pop()
                    mode.__exit__(None, None, None)
                    if mode.calls != 1:
                        raise RuntimeError(
                            f"router_replay: {type(module).__name__} called torch.topk "
                            f"{mode.calls} times in one forward, not once: pass "
                            "router_replay=None for this model"
                        )

            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post, always_call=True))

    @property
    def num_layers(self) -> int:
        """``Y``: the MoE layers (router modules) of the model."""
        return self._layers

    @property
    def active(self) -> bool:
        """Inside :meth:`recording` or :meth:`replaying`."""
        return self._mode is not None

    def empty_routes(self, rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """[M, L, Y, k] of -1 (nothing recorded) for ``rows`` of shape ``(M, L)``."""
        shape = (*rows, self._layers, self.top_k)
        return torch.full(shape, -1, dtype=ROUTE_DTYPE, device=device)

    @contextlib.contextmanager
    def recording(self, routes: torch.Tensor) -> Iterator[None]:
        """The actor's forwards inside write their routes into ``routes`` [M, L, Y, k]."""
        with replayable(functools.partial(self._set, "record", routes)):
            yield

    @contextlib.contextmanager
    def replaying(self, routes: torch.Tensor) -> Iterator[None]:
        """The actor's forwards inside route as ``routes`` [M, L, Y, k] (-1: their own)."""
        self._flips = {}
        with replayable(functools.partial(self._set, "replay", routes)):
            yield

    @contextlib.contextmanager
    def _set(self, mode: str, routes: torch.Tensor) -> Iterator[None]:
        if routes.dim() != 4 or routes.shape[2:] != (self._layers, self.top_k):
            raise ValueError(
                f"routes {tuple(routes.shape)} must be [M, L, Y, k] with Y={self._layers} MoE "
                f"layers and k={self.top_k}"
            )
        saved = self._mode, self._routes
        self._mode, self._routes = mode, routes.view(-1, *routes.shape[2:])
        try:
            yield
        finally:
            self._mode, self._routes = saved

    @contextlib.contextmanager
    def _laid_out(self, index: torch.Tensor) -> Iterator[None]:
        saved, self._index = self._index, index
        try:
            yield
        finally:
            self._index = saved

    def probe(self) -> None:
        """Record the routes of a one-token forward: raise now if the routers are not replayable.

        Raises:
            ValueError: A router that does not choose its experts with one ``torch.topk`` of
                ``k`` over ``[S, E]`` scores (names its class and the argument).
        """
        device = next(self.model.parameters()).device
        routes = self.empty_routes((1, 1), device)
        ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        try:
            with torch.no_grad(), self.recording(routes), laid_out(self, ids[0]):
                self.model(input_ids=ids)
        except RuntimeError as error:
            if "router_replay" not in str(error):
                raise
            raise ValueError(str(error)) from None
        if not bool((routes >= 0).all()):
            raise ValueError(
                f"router_replay: {type(self.model).__name__}'s forward did not call each of its "
                f"{self._layers} routers once: pass router_replay=None for this model"
            )

    def flips(self) -> float | None:
        """Of the last replayed forward's (token, layer) pairs with a recorded route, the
        fraction whose own top-k would have chosen other experts (None: nothing replayed).
        """  # noqa: D205
        if not self._flips:
            return None
        counted = int(sum(c for _, c in self._flips.values()))
        return int(sum(f for f, _ in self._flips.values())) / counted if counted else None

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def laid_out(
    replay: RouterReplay | None, index: torch.Tensor
) -> contextlib.AbstractContextManager[Any]:
    """The forward inside runs ``index`` [S] long: flat position ``s`` is row position
    ``m * L + t`` of the forward's ``[M, L]`` rows (a no-op without an active replay).
    """  # noqa: D205
    if replay is None or not replay.active:
        return contextlib.nullcontext()
    return replayable(functools.partial(replay._laid_out, index))


def replaying(
    replay: RouterReplay | None, routes: torch.Tensor | None
) -> contextlib.AbstractContextManager[Any]:
    """``replay.replaying(routes)``; without routes (nothing recorded: an on-policy update) a
    no-op after which :meth:`RouterReplay.flips` is None.
    """  # noqa: D205
    if replay is None:
        return contextlib.nullcontext()
    if routes is None:
        replay._flips = {}
        return contextlib.nullcontext()
    return replay.replaying(routes)


def build_router_replay(
    agent: str, mode: str | None, model: torch.nn.Module
) -> RouterReplay | None:
    """The routing replay ``mode`` of ``agent`` (its class name) on ``model``, or None (off).

    Raises:
        ValueError: a ``mode`` on a model that declares no router, or whose routers are not
            replayable (:meth:`RouterReplay.probe`); the message names the argument.
    """
    if mode is None:
        return None
    if router_module_class(model) is None:
        raise ValueError(
            f"{agent}(router_replay={mode!r}): {type(model).__name__} is not a "
            "mixture-of-experts model (it declares no router), so there are no routes to "
            "replay; leave router_replay unset"
        )
    replay = RouterReplay(model, experts_per_token(model), mode)
    replay.probe()
    return replay
