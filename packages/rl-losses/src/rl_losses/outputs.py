"""Typed results: the loss plus detached diagnostics, never positional tuples."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["EntropyOutput", "KLOutput", "PolicyLossOutput", "RolloutCorrection", "ValueLossOutput"]


class _Metrics:
    """``metrics()``: every 0-dim tensor field except ``loss`` as a Python float."""

    def metrics(self) -> dict[str, float]:
        """Diagnostics as floats (reads the device once per field)."""
        out: dict[str, float] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                out[f.name] = float(value.detach())
        return out


@dataclass(frozen=True)
class PolicyLossOutput(_Metrics):
    """A policy objective's loss and diagnostics (means over valid units, detached)."""

    loss: torch.Tensor
    """Scalar loss to minimise (differentiable)."""
    clip_frac_low: torch.Tensor
    """Fraction of units clipped at the lower bound with a negative advantage."""
    clip_frac_high: torch.Tensor
    """Fraction of units clipped at the upper bound with a positive advantage."""
    approx_kl: torch.Tensor
    r"""Mean of :math:`(r - 1) - \log r`, an estimate of KL(old || current)."""
    ratio_mean: torch.Tensor
    """Mean importance ratio."""
    ratio_max: torch.Tensor
    """Largest importance ratio."""


@dataclass(frozen=True)
class ValueLossOutput(_Metrics):
    """A value loss and diagnostics."""

    loss: torch.Tensor
    """Scalar loss (differentiable)."""
    clip_frac: torch.Tensor
    """Fraction of valid elements whose value moved more than the clip range."""
    value_mean: torch.Tensor
    """Mean predicted value."""
    explained_variance: torch.Tensor
    """1 - Var(R - V) / Var(R) over valid elements (0 when Var(R) = 0)."""


@dataclass(frozen=True)
class KLOutput(_Metrics):
    """A KL penalty and diagnostics."""

    loss: torch.Tensor
    """``coef`` times the aggregated KL estimate (differentiable)."""
    kl_mean: torch.Tensor
    """Mean per-token KL estimate over valid tokens."""
    kl_max: torch.Tensor
    """Largest per-token KL estimate over valid tokens."""


@dataclass(frozen=True)
class EntropyOutput(_Metrics):
    """An entropy bonus and diagnostics."""

    loss: torch.Tensor
    """``-coef`` times the aggregated entropy (differentiable)."""
    entropy_mean: torch.Tensor
    """Mean per-token entropy over valid tokens."""


@dataclass(frozen=True)
class RolloutCorrection(_Metrics):
    """Importance weights correcting the sampler/trainer mismatch, with metrics."""

    weights: torch.Tensor
    """[N, T] detached weights to multiply the per-token policy loss with (0 where masked)."""
    mask: torch.Tensor
    """[N, T] the input mask, narrowed by ``mode="mask"``."""
    ratio_mean: torch.Tensor
    """Mean raw ratio pi_old / pi_sampler."""
    frac_clamped: torch.Tensor
    """Fraction of tokens (or sequences) truncated or masked."""
    ess: torch.Tensor
    """Normalised effective sample size (sum w)^2 / (n sum w^2), in (0, 1]."""
    mismatch_kl: torch.Tensor
    """Mean k3 estimate of KL(pi_sampler || pi_old) over valid tokens."""
