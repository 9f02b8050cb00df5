"""The experts a mixture-of-experts model routes each token to while it generates (R3).

A transformers MoE model routes each token to the ``k`` experts of highest router score in
every MoE layer, with one ``torch.topk`` in each router module (the module the model declares
in ``_can_record_outputs["router_logits"]``). :class:`RouteRecorder` records those indices in
every forward of a generation (the prefill ``[R, P]``, then one ``[R, 1]`` per new token), so
that a trainer can force the sampler's routes in its own forwards (rollout routing replay,
"R3": Ma et al., 2025; verl, NeMo-RL, slime). Inside a router's forward a ``TorchFunctionMode``
reads its ``torch.topk``; a router that calls it another number of times, with another ``k``
or on another shape is refused with its class name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["ROUTE_DTYPE", "RouteRecorder", "router_modules"]

#: Dtype of recorded routes (expert indices; -1 where a position has none).
ROUTE_DTYPE = torch.int16


def router_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router modules of ``model`` in layer order (none for a dense model).

    transformers' MoE models declare the module whose output holds the router logits in
    ``_can_record_outputs["router_logits"]`` (an ``OutputRecorder``).
    """
    for module in model.modules():
        recorder = getattr(type(module), "_can_record_outputs", None)
        spec = recorder.get("router_logits") if isinstance(recorder, dict) else None
        target = getattr(spec, "target_class", None)
        if isinstance(target, type) and issubclass(target, torch.nn.Module):
            return [m for m in model.modules() if isinstance(m, target)]
    return []


class _TopK(TorchFunctionMode):
    """Records the indices of the one ``torch.topk`` of a router's forward."""

    def __init__(self, top_k: int, router: str) -> None:
        super().__init__()
        self.top_k, self.router = top_k, router
        self.indices: list[torch.Tensor] = []
        self.failed = False

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.topk, torch.Tensor.topk):
            scores = args[0]
            k = args[1] if len(args) > 1 else kwargs.get("k")
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            if self.indices or k != self.top_k or scores.dim() != 2 or dim not in (-1, 1):
                self.failed = True  # the forward raises this, not the hook's count
                raise RuntimeError(
                    f"router routes: {self.router} chose its experts with a torch.topk the "
                    f"recorder does not know (k={k}, scores {tuple(scores.shape)}, dim={dim}, "
                    f"call {len(self.indices) + 1}; expected one call, k={self.top_k}, [S, E])"
                )
            self.indices.append(out.indices)
        return out


class RouteRecorder:
    """Within ``with recorder:``, every forward of ``model`` records its routes.

    :meth:`routes` assembles them for ``R`` rows: ``[R, S, Y, k]``, ``S`` the positions the
    forwards ran (a generation: the prompt's ``P``, then one per fed token), ``Y`` the MoE
    layers, in the order the forwards ran.
    """

    def __init__(self, model: torch.nn.Module, top_k: int) -> None:
        self.model, self.top_k = model, top_k
        self.routers = router_modules(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} declares no router: not a mixture of experts")
        self._calls: list[tuple[int, torch.Tensor]] = []
        self._handles: list[Any] = []

    def __enter__(self) -> RouteRecorder:
        self._calls = []
        for layer, module in enumerate(self.routers):
            modes: list[_TopK] = []

            def pre(module: torch.nn.Module, args: Any, modes: list[_TopK] = modes) -> None:
                del args
                mode = _TopK(self.top_k, type(module).__name__)
                mode.__enter__()
                modes.append(mode)

            def post(
                module: torch.nn.Module,
                args: Any,
                output: Any,
                layer: int = layer,
                modes: list[_TopK] = modes,
            ) -> None:
                del args, output
                mode = modes.pop()
                mode.__exit__(None, None, None)
                if mode.failed:  # the forward is raising its error
                    return
                if len(mode.indices) != 1:
                    raise RuntimeError(
                        f"router routes: {type(module).__name__} called torch.topk "
                        f"{len(mode.indices)} times in one forward, not once"
                    )
                self._calls.append((layer, mode.indices[0]))

            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post, always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def routes(self, rows: int) -> torch.Tensor:
        """[R, S, Y, k] int16: the recorded forwards' routes, forward after forward."""
        Y = len(self.routers)
        if len(self._calls) % Y or any(layer != i % Y for i, (layer, _) in enumerate(self._calls)):
            raise RuntimeError(
                f"router routes: {len(self._calls)} router calls do not make whole forwards "
                f"of the {Y} layers in order"
            )
        forwards = []
        for f in range(0, len(self._calls), Y):
            layers = torch.stack([t for _, t in self._calls[f : f + Y]], dim=1)  # [R * S, Y, k]
            forwards.append(layers.reshape(rows, -1, Y, self.top_k))
        return torch.cat(forwards, dim=1).to(ROUTE_DTYPE)
