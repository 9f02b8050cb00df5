"""Fast role switches on a peft model: touch only the LoRA layers, found once.

peft's model-level ``set_adapter`` / ``disable_adapter`` walk every module of the model and
reset ``requires_grad`` on the way, and restoring the trainable set afterwards walks every
parameter again; on a small model that is a third of an RL update. :class:`LoraSites` records
each LoRA layer (and where it hangs in its parent) once, then switches roles by visiting only
those layers:

* :meth:`LoraSites.bypassed`: each LoRA layer is replaced in its parent by its own base layer,
  so the forward is the base model's, exactly (what ``disable_adapter()`` computes: the base
  layer's output, nothing added); also what a frozen adapter whose delta is exactly zero
  computes (:meth:`LoraSites.delta_is_zero`: peft's ``B = 0`` initialisation);
* :meth:`LoraSites.active`: each layer's public ``set_adapter(role)``, then back to the actor
  with the trainable flags put back from a list recorded once;
* :meth:`LoraSites.lean`: for training, each plain LoRA ``Linear`` wrapped in a
  :class:`~rl_adapters.lean_lora.LeanLora` (one autograd node, in-place accumulation);
* :meth:`LoraSites.merged`: for generation, each plain LoRA ``Linear`` is replaced by a linear
  layer holding ``W + scaling * B @ A`` (peft's ``get_delta_weight``), so sampling runs at the
  speed of the bare model. The base weight ``W`` is never written: the merged weight is a new
  tensor, dropped on exit, so leaving the context restores the model bit for bit.

All four are context managers that put every layer back on exit, also on an exception. A
swap writes the parent's ``_modules`` entry directly (what ``nn.Module.__setattr__`` ends up
doing for a module already registered under that name, without its checks: a few microseconds
per layer and switch), and the :class:`~rl_adapters.lean_lora.LeanLora` wrappers are built
once per site.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rl_adapters import _compat
from rl_adapters.lean_lora import LeanLora, adapter_blocker, lean_blocker
from rl_adapters.lean_report import LeanFallback, LeanSwap, count_swap, group_fallbacks

__all__ = ["LoraSite", "LoraSites"]


@dataclass(frozen=True)
class LoraSite:
    """One LoRA layer and where it hangs: ``getattr(parent, name) is layer``."""

    parent: nn.Module
    name: str
    layer: Any
    """A peft ``BaseTunerLayer`` module (``base_layer``, ``set_adapter``, ``get_delta_weight``)."""


class _MergedLinear(nn.Module):
    """``x @ weight.T + bias`` with a merged weight held as a plain tensor (not a parameter)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., out] the merged projection of [..., in] ``x``."""
        return nn.functional.linear(x, self.weight, self.bias)


class LoraSites:
    """The LoRA layers of a peft model, recorded once, and role switches over them.

    Args:
        model: The peft model (or its inner transformers model) with LoRA layers injected.
        trainable: Parameters that must be trainable after every switch (the actor's and the
            critic's adapter weights).
    """

    def __init__(self, model: nn.Module, trainable: Sequence[nn.Parameter]) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer  # heavy: only with LoRA

        sites: list[LoraSite] = []
        for parent in model.modules():
            for name, child in parent.named_children():
                if isinstance(child, BaseTunerLayer):
                    sites.append(LoraSite(parent, name, child))
        self.sites = tuple(sites)
        self.trainable = tuple(trainable)
        self._lean: dict[int, LeanLora] = {}  # site index -> its wrapper, built once
        # site index -> (base layer, its weight (weak references), lean_blocker's answer)
        self._blocked: dict[int, tuple[Any, Any, tuple[str, bool] | None]] = {}
        self._zero: dict[str, tuple[tuple[tuple[int, int], ...], bool]] = {}  # delta_is_zero

    def __len__(self) -> int:
        return len(self.sites)

    def partitioned(self) -> bool:
        """Whether DeepSpeed ZeRO-3 partitions the weights; the switches here do not apply then.

        Checked at each use (the DeepSpeed engine is built after the model), on the first
        layer's base weight: ZeRO-3 partitions every parameter, that one included.
        """
        if not self.sites:
            return False
        base = _compat.read(self.sites[0].layer, "base_layer", None)
        weight = getattr(base, "weight", None)
        if weight is not None:
            return hasattr(weight, "ds_id")
        return any(hasattr(p, "ds_id") for p in self.sites[0].layer.parameters())

    @contextlib.contextmanager
    def _swapped(self, replacements: Sequence[tuple[LoraSite, nn.Module]]) -> Iterator[None]:
        """Hang each replacement where its site's LoRA layer hangs; put back what hung there.

        What hung there is the LoRA layer, or a :class:`~rl_adapters.lean_lora.LeanLora` around
        it when the switch runs inside :meth:`lean`.
        """
        done: list[tuple[LoraSite, nn.Module]] = []
        try:
            for site, module in replacements:
                children = site.parent._modules
                done.append((site, children[site.name]))  # type: ignore[arg-type]
                children[site.name] = module
            yield
        finally:
            for site, previous in reversed(done):
                site.parent._modules[site.name] = previous

    @property
    def bypassable(self) -> bool:
        """Whether every LoRA layer's ``base_layer`` can be read (:meth:`bypassed` needs it)."""
        return all(not _compat.missing(s.layer, ("base_layer",)) for s in self.sites)

    @contextlib.contextmanager
    def bypassed(self) -> Iterator[None]:
        """Run the base model: every LoRA layer replaced by its own base layer.

        Needs :attr:`bypassable` (the policy uses peft's ``disable_adapter()`` otherwise).
        """
        bases = [(s, _compat.read(s.layer, "base_layer")) for s in self.sites]
        with self._swapped(bases):
            yield

    @contextlib.contextmanager
    def active(self, adapter: str, restore: str = "actor") -> Iterator[None]:
        """Run with ``adapter`` active in every LoRA layer; ``restore`` active after.

        peft's per-layer ``set_adapter`` marks only the active adapter trainable; on exit the
        recorded trainable parameters are made trainable again.
        """
        try:
            for site in self.sites:
                site.layer.set_adapter(adapter)
            yield
        finally:
            for site in self.sites:
                site.layer.set_adapter(restore)
            for p in self.trainable:
                p.requires_grad_(True)

    @contextlib.contextmanager
    def lean(self) -> Iterator[None]:
        """Train through :class:`~rl_adapters.lean_lora.LeanLora`: one autograd node per layer.

        Each plain LoRA linear layer (:func:`~rl_adapters.lean_lora.lean_blocker`) currently
        hanging in its parent is wrapped for the body; the forward and its backward (also an
        activation-checkpointing recomputation inside the body) compute what the peft layer
        computes, to float rounding, with fewer full-size temporaries. Role switches inside
        the body work as outside (the wrapper follows the layer's active adapter).
        """
        replacements: list[tuple[LoraSite, nn.Module]] = []
        for k, site in enumerate(self.sites):
            if site.parent._modules[site.name] is not site.layer:
                continue
            blocked = self._blocker(k, site)
            if blocked is not None:
                if blocked[1]:  # a peft internal went missing since the policy's report
                    _compat.warn_once(blocked[0], "peft")
                continue
            if k not in self._lean:
                self._lean[k] = LeanLora(site.layer)
            self._lean[k].refresh()  # settings may have changed since the last body
            replacements.append((site, self._lean[k]))
        with self._swapped(replacements):
            yield

    def _blocker(self, k: int, site: LoraSite) -> tuple[str, bool] | None:
        """:func:`~rl_adapters.lean_lora.lean_blocker` of site ``k``, re-run when its base changes.

        The static half of the check reads every peft internal of the layer; its answer holds
        while the layer keeps its base layer and base weight (a quantised or ZeRO-3 base
        replaces them). An internal that goes missing later sends :class:`LeanLora` to
        peft's own forward at its next call, with the warning.
        """
        base = _compat.read(site.layer, "base_layer", None)
        weight = getattr(base, "weight", None)
        known = base is not None and weight is not None
        cached = self._blocked.get(k)
        if known and cached is not None and cached[0]() is base and cached[1]() is weight:
            return cached[2]
        blocked = lean_blocker(site.layer)
        if known:
            self._blocked[k] = (weakref.ref(base), weakref.ref(weight), blocked)
        return blocked

    def survey(self, adapter: str = "actor") -> tuple[LeanSwap, list[LeanFallback]]:
        """The layers that run the lean LoRA forward with ``adapter`` active, and the others.

        The others run peft's forward, with the reason; for the policy's
        :class:`~rl_adapters.lean_report.LeanReport`. A lean layer whose dropout has ``p > 0``
        is also noted: its forwards in training mode run peft's (live dropout).
        """
        lean: list[str] = []
        fell: list[tuple[str, str, bool]] = []
        for site in self.sites:
            target = type(site.layer).__name__
            blocked = lean_blocker(site.layer)
            if blocked is None:
                reason = adapter_blocker(site.layer, adapter)
                blocked = None if reason is None else (f"{adapter} adapter: {reason}", False)
            if blocked is None:
                lean.append(target)
                dropouts = _compat.read(site.layer, "lora_dropout", {})
                dropout = dict(dropouts).get(adapter)  # a ModuleDict has no get
                if isinstance(dropout, nn.Dropout) and dropout.p > 0:
                    reason = f"lora_dropout p={dropout.p}: peft's forward in training mode"
                    fell.append((target, reason, False))
            else:
                fell.append((target, *blocked))
        return count_swap("lora", lean), group_fallbacks("lora", fell)

    def mergeable(self, adapter: str) -> list[LoraSite]:
        """Sites whose ``adapter`` can be merged: plain LoRA over an ``nn.Linear``.

        Excluded (they keep their LoRA forward): variants such as DoRA, non-linear layers
        (embeddings, convolutions), quantized or partitioned base weights.
        """
        out = []
        for site in self.sites:
            layer = site.layer
            base = _compat.read(layer, "base_layer", None)
            ok = (
                type(base) is nn.Linear
                and adapter_blocker(layer, adapter) is None
                and not _compat.read(layer, "merged_adapters", ["unknown"])
                and callable(_compat.read(layer, "get_delta_weight", None))
                and base.weight.dtype.is_floating_point
                and not hasattr(base.weight, "ds_id")  # ZeRO-3 partition
            )
            if ok:
                out.append(site)
        return out

    def delta_is_zero(self, adapter: str) -> bool:
        """Whether ``adapter`` changes nothing: every layer mergeable, every ``lora_B`` zero.

        Then ``W + scaling * B @ A = W`` exactly, and :meth:`bypassed` computes what
        :meth:`merged` would, without building the merged weights. That is the state of a
        reference adapter copied from a freshly initialised actor (peft sets ``B = 0``) until
        the first :meth:`~rl_adapters.PolicyModel.sync_reference`. The answer is cached and
        recomputed when any ``lora_B`` weight of the adapter is replaced or written in place
        (its identity and ``Tensor._version``, which every in-place write bumps). What makes a
        layer mergeable (its base, variant and LoRA bias) is fixed when the adapter is built.
        """
        lora_b = [_compat.read(site.layer, "lora_B", {}) for site in self.sites]
        if not self.sites or any(adapter not in b for b in lora_b):
            return False
        weights = [b[adapter].weight for b in lora_b]
        key = tuple((id(w), w._version) for w in weights)
        cached = self._zero.get(adapter)
        if cached is not None and cached[0] == key:
            return cached[1]
        mergeable = len(self.mergeable(adapter)) == len(self.sites)
        zero = mergeable and not any(bool(w.detach().any()) for w in weights)
        self._zero[adapter] = (key, zero)
        return zero

    @contextlib.contextmanager
    def merged(self, adapter: str = "actor") -> Iterator[None]:
        """Run with ``adapter`` merged into new base weights (inference only, no gradient).

        Each mergeable layer (:meth:`mergeable`) is replaced by a linear layer with weight
        ``W + scaling * B @ A``; the others run their LoRA forward with ``adapter`` active (as
        :meth:`active`). ``W`` itself is not modified.
        """
        mergeable = self.mergeable(adapter)
        replacements: list[tuple[LoraSite, nn.Module]] = []
        with torch.no_grad():
            for site in mergeable:
                base = _compat.read(site.layer, "base_layer")
                delta = _compat.read(site.layer, "get_delta_weight")(adapter)
                weight = base.weight + delta.to(base.weight.dtype)
                replacements.append((site, _MergedLinear(weight, base.bias)))
        rest = len(mergeable) < len(self.sites)
        with (
            self.active(adapter) if rest else contextlib.nullcontext(),
            self._swapped(replacements),
        ):
            yield
