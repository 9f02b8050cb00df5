"""The optimizer step: micro-batch accumulation, DDP/DeepSpeed, clipping, the non-finite guard.

A :class:`Learner` owns AdamW (one parameter group per trained part), the optional cosine
schedule and, lazily, the DeepSpeed engine. :meth:`Learner.step` takes one minibatch as a list
of :class:`~rl_algos.batch.MicroBatch` and a loss function; every loss is already divided by
the minibatch's *global* normaliser (summed over processes, :meth:`Learner.normalizers`), so the
accumulated gradient, summed over processes, is exactly the gradient of the whole minibatch.

No training continues on NaN: a non-finite loss or gradient on any process leaves the weights
untouched and raises ``FloatingPointError`` (or, with ``skip_nonfinite``, warns and skips the
step). Every process runs the same collectives whatever its micro-batches hold, so a NaN on one
rank never hangs the others. An update from a finite gradient that makes a weight non-finite
(an overflow: a learning rate far too large) raises ``FloatingPointError`` at that step,
whatever ``skip_nonfinite`` says: the weights have changed and cannot continue (checked outside
DeepSpeed, whose partitioned weights the next step's loss guard catches instead).
A minibatch without an action token on any process (every row
filtered out) takes no step at all; every process sees the same all-reduced counts, so all of
them skip it together.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_algos.batch import MicroBatch, Normalizers
from rl_algos.config import CosineLRScheduleConfig, cosine_schedule
from rl_algos.distributed import deepspeed_plugin, prepare_deepspeed, world_size, zero_stage
from rl_algos.objectives import LossTerms

__all__ = ["Learner", "StepResult", "fused_adamw", "summarize"]

LossFn = Callable[[MicroBatch], LossTerms | None]


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did."""

    applied: bool
    """False when the step was skipped (non-finite with ``skip_nonfinite``, or ``empty``)."""
    loss: float
    """The minibatch loss (sum of the micro-batch losses)."""
    grad_norm: float
    """Gradient norm before clipping (NaN when skipped)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Loss diagnostics, micro-batches weighted by their share of the action tokens."""
    empty: bool = False
    """The minibatch had no action token on any process (``Normalizers.empty``): no loss was
    computed and no step taken."""


def distributed() -> bool:
    """Whether several processes train together."""
    return world_size() > 1


def all_ranks(flag: bool, device: torch.device) -> bool:
    """``flag`` and-ed over processes (every rank gets the same answer)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return bool(t.item() == 1.0)


def broadcast_module(module: torch.nn.Module) -> None:
    """Start every process from rank 0's weights of ``module``."""
    if not distributed():
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            torch.distributed.broadcast(t.data, src=0)


def sum_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Data parallelism: sum the gradients over processes (in one flat all-reduce).

    Every process's loss is already divided by the global (all-reduced) token or sequence
    count, so the sum is the gradient of the global-batch loss, exactly as one process would
    compute it on the whole batch (DDP's average would need equal local batches).
    """
    if not distributed():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
        offset += n


def fused_adamw(groups: list[dict[str, Any]], deepspeed: bool) -> bool | None:
    """AdamW's ``fused`` flag: True where PyTorch's fused kernel serves every parameter.

    That is: floating point, on CPU or CUDA, and DeepSpeed does not own the step; otherwise
    None (PyTorch's default).

    The fused kernel is one call per step instead of a dozen small ops per parameter (LoRA has
    a few hundred small tensors); the time it saves is in ``docs/benchmarks.md``.
    """
    params = [p for g in groups for p in g["params"]]
    ok = not deepspeed and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )
    return True if ok and params else None


class Learner:
    """AdamW over parameter groups, the schedule, and the guarded, accumulated step.

    Args:
        groups: AdamW parameter groups (``{"params": [...], "lr": ...}``), the actor's first.
        lr: Default learning rate.
        max_grad_norm: Clip the global gradient norm (None: no clipping).
        schedule: Cosine schedule with warm-up, or None.
        accelerator: An ``accelerate.Accelerator`` (DDP or DeepSpeed), or None.
        skip_nonfinite: Skip non-finite steps with a warning instead of raising.
        micro_batch_size: DeepSpeed's ``train_micro_batch_size_per_gpu``.
        device: Where the normalisers are all-reduced.
    """

    def __init__(
        self,
        groups: list[dict[str, Any]],
        lr: float,
        max_grad_norm: float | None,
        schedule: CosineLRScheduleConfig | None,
        accelerator: Any = None,
        skip_nonfinite: bool = False,
        micro_batch_size: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_grad_norm = max_grad_norm
        self.accelerator = accelerator
        self.skip_nonfinite = skip_nonfinite
        self.micro_batch_size = micro_batch_size
        self.device = torch.device(device)
        self.zero_stage = zero_stage(accelerator)
        self.ds_engine: Any = None
        self.warned_optimizer = False  # the once-only "no optimizer state under DeepSpeed"
        self.optimizer = torch.optim.AdamW(
            groups, lr=lr, weight_decay=0.0, fused=fused_adamw(groups, self.uses_deepspeed)
        )
        self.lr_scheduler = (
            cosine_schedule(self.optimizer, schedule) if schedule is not None else None
        )

    # -- parallelism -----------------------------------------------------------------------------

    @property
    def uses_deepspeed(self) -> bool:
        """Whether the accelerator carries a DeepSpeed plugin."""
        return deepspeed_plugin(self.accelerator) is not None

    def deepspeed(self, module: torch.nn.Module) -> Any:
        """The DeepSpeed engine wrapping ``module`` and the optimizer, built on first use."""
        if self.ds_engine is None and self.uses_deepspeed:
            self.ds_engine = prepare_deepspeed(
                self.accelerator,
                module,
                self.optimizer,
                self.micro_batch_size,
                self.max_grad_norm,
            )
        return self.ds_engine

    def trainable(self) -> list[torch.nn.Parameter]:
        """Every parameter the optimizer updates."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def normalizers(self, mask: torch.Tensor, turn_mask: torch.Tensor | None) -> Normalizers:
        """Global denominators of a minibatch's ``mask`` [M, T] (and ``turn_mask`` [M, K])."""
        counts = torch.tensor(
            [
                float(mask.sum()),
                float(mask.any(1).sum()),
                float(turn_mask.sum()) if turn_mask is not None else 1.0,
            ],
            dtype=torch.float64,
            device=mask.device,
        )
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)
        values = counts.tolist()  # one read back for the three counts
        empty = values[0] == 0.0  # the same on every process: the counts are global
        tokens, sequences, turns = (max(1.0, c) for c in values)
        return Normalizers(tokens, sequences, turns, empty)

    # -- the step --------------------------------------------------------------------------------

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        ds = self.ds_engine
        if ds is not None:
            ds.set_gradient_accumulation_boundary(last)
            # DeepSpeed averages over ranks; the loss already has global denominators
            ds.backward(loss * world_size(), scale_wrt_gas=False)
        elif self.accelerator is not None:
            self.accelerator.backward(loss)
        else:
            loss.backward()

    def _zero_grad(self) -> None:
        if self.ds_engine is None:
            for p in self.trainable():  # zero_grad(set_to_none=True), without its overhead
                p.grad = None
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def step(
        self,
        micro_batches: Sequence[MicroBatch],
        loss_fn: LossFn,
        norm: Normalizers,
        where: str = "",
    ) -> StepResult:
        """Accumulate ``loss_fn`` over ``micro_batches`` and take one guarded optimizer step.

        With ``norm.empty`` (no action token on any process: every row filtered out) nothing
        runs: no loss, no optimizer or scheduler step (AdamW would still move the weights by
        its moments and count the step), and the result has ``empty=True``. Every process gets
        the same ``norm``, so all of them return here together and no collective is left
        waiting.

        Args:
            micro_batches: One minibatch, split.
            loss_fn: ``mb -> LossTerms`` (or None when the log-probs are not finite).
            norm: The minibatch's global normalisers (weights the reported metrics).
            where: Names the step in the non-finite error (agent and step index).

        Raises:
            FloatingPointError: A non-finite loss or gradient (weights untouched), unless
                ``skip_nonfinite``.
        """
        if norm.empty:
            return StepResult(False, math.nan, math.nan, empty=True)
        ds = self.ds_engine
        self._zero_grad()
        total = 0.0
        parts: dict[str, float] = {}
        for i, mb in enumerate(micro_batches):
            if ds is not None and hasattr(ds.optimizer, "clear_backward_seen_flag"):
                # what DeepSpeedEngine.forward does first: the micro-step bookkeeping that
                # makes ZeRO accumulate (not overwrite) gradients across micro-batches
                ds.optimizer.clear_backward_seen_flag()
            terms = loss_fn(mb)
            value = math.nan if terms is None else float(terms.loss.detach())
            ok = math.isfinite(value)
            if ds is not None:  # DeepSpeed reduces inside backward: all ranks agree first
                ok = all_ranks(ok, self.device)
            if not ok or terms is None:
                total = math.nan  # the guard below raises or skips; nothing is applied
                break
            self._backward(terms.loss, i == len(micro_batches) - 1)
            total += value
            weight = float(mb.mask.sum()) / norm.tokens
            for k, v in terms.metrics.items():
                parts[k] = parts.get(k, 0.0) + float(v) * weight
        if ds is not None:
            return self._deepspeed_step(ds, total, parts, where)
        params = self.trainable()
        sum_gradients(params)
        finite = all_ranks(math.isfinite(total), self.device)
        grad_norm = math.nan
        if finite and self.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        elif finite:
            grads = [p.grad.detach().norm() for p in params if p.grad is not None]
            grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
        if not finite or not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return self._nonfinite(total, grad_norm, where)
        self.optimizer.step()
        _check_updated(self.optimizer, where, grad_norm)
        return self._finish(total, grad_norm, parts)

    def _deepspeed_step(
        self, ds: Any, total: float, parts: dict[str, float], where: str
    ) -> StepResult:
        if not math.isfinite(total):  # every rank agreed on every micro-batch
            ds.zero_grad()
            ds.optimizer.zero_grad(set_to_none=True)
            return self._nonfinite(total, math.nan, where)
        ds.step()
        value = ds.get_global_grad_norm()
        return self._finish(total, float(value) if value is not None else math.nan, parts)

    def _finish(self, total: float, grad_norm: float, parts: dict[str, float]) -> StepResult:
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return StepResult(True, total, grad_norm, parts)

    def _nonfinite(self, total: float, grad_norm: float, where: str) -> StepResult:
        message = (
            f"non-finite loss or gradient at {where} (loss={total}, grad_norm={grad_norm}); "
            "the weights were not updated"
        )
        if not self.skip_nonfinite:
            raise FloatingPointError(message + ". Pass skip_nonfinite=True to skip such steps")
        warnings.warn(message + "; step skipped", RuntimeWarning, stacklevel=4)
        return StepResult(False, total, grad_norm)


def _check_updated(optimizer: torch.optim.Optimizer, where: str, grad_norm: float) -> None:
    """Raise if the optimizer step just taken made a trained weight non-finite.

    One flag per tensor, reduced on the device and read once (a single synchronisation).
    """
    tensors = [(g, p) for g, group in enumerate(optimizer.param_groups) for p in group["params"]]
    if not tensors:
        return
    flags = torch.stack([torch.isfinite(p.detach()).all() for _, p in tensors])
    if bool(flags.all()):
        return
    marks = zip(tensors, flags.tolist(), strict=True)
    bad = [f"group {g} {tuple(p.shape)}" for (g, p), ok in marks if not ok]
    raise FloatingPointError(
        f"the update at {where} made {len(bad)} of {len(tensors)} trained tensors non-finite "
        f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}; group 0 is the actor's) from "
        f"a finite loss and gradient (grad_norm={grad_norm}): the step overflowed, typically a "
        "learning rate far too large. The weights are no longer usable: resume from the last "
        "checkpoint with a smaller lr"
    )


def summarize(metrics: dict[str, list[float]], rewards: torch.Tensor) -> dict[str, float]:
    """``learn()``'s metrics from the per-step values it collected.

    Each value averaged over the steps; ``loss`` the last step's (NaN when every step was
    skipped as non-finite, absent when no step ran: every row filtered out) and, over several
    steps, ``mean_loss`` their mean; ``mean_reward`` of [N] ``rewards`` (per-turn [N, K]
    summed per row); ``mean_kl`` where a KL was computed. Only computed values are reported.
    """
    out = {k: sum(v) / len(v) for k, v in metrics.items() if v}
    losses = metrics.get("loss", [])
    if losses:
        out["loss"] = losses[-1]
    elif metrics.get("skipped_steps"):
        out["loss"] = math.nan
    if len(losses) > 1:  # one step: it would be ``loss`` again
        out["mean_loss"] = sum(losses) / len(losses)
    r = rewards.float()
    out["mean_reward"] = float(r.sum(-1).mean() if r.dim() == 2 else r.mean())
    if "kl" in out:
        out["mean_kl"] = out["kl"]
    return out
