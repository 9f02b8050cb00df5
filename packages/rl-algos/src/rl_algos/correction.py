r"""Phase 5 of ``learn()``: the rollout correction for a sampler/trainer mismatch.

When the completions were sampled by another engine (vLLM, a remote server) with log-probs
``sampling_logprobs`` [N, T] (shifted by one against ``input_ids``), the trainer's old
log-probs ``old_logprobs`` differ from them by the engines' numerics. The correction weighs
each token by the truncated importance ratio (:func:`rl_losses.rollout_correction`; TIS, Yao
et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):

.. math:: w_t = \min\left(\frac{\pi_{old}(y_t)}{\pi_{sampler}(y_t)}, C\right)

Two places apply it, and this module is both: off-policy updates (several epochs or
minibatches) weigh the whole batch once from the scored old log-probs
(:meth:`SamplerCorrection.weigh_batch`); an on-policy update, whose old log-probs are the
loss's own detached ones, weighs each micro-batch by the log-probs it has just computed
(:meth:`SamplerCorrection.weigh_micro_batch`). With ``clip_against_sampler`` the sampler's
log-probs are the old ones (phase 3) and nothing is weighed here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from rl_losses import rollout_weights

from rl_algos.batch import Batch, Estimates, MicroBatch, Scores

__all__ = ["SamplerCorrection"]


@dataclass(frozen=True)
class SamplerCorrection:
    """The correction an agent's config asks for (read afresh each ``learn()``)."""

    enabled: bool
    """``vllm_importance_sampling_correction``: weigh by old / sampler probabilities."""
    clip_against_sampler: bool
    """``clip_against_sampler``: the sampler's log-probs are the old ones (no weights)."""
    cap: float
    """``vllm_importance_sampling_cap``: the truncation ``C`` of each weight."""

    @classmethod
    def from_config(cls, config: Any) -> SamplerCorrection:
        """The correction of an :class:`~rl_algos.config.AgentConfig`."""
        return cls(
            bool(config.vllm_importance_sampling_correction),
            bool(config.clip_against_sampler),
            float(config.vllm_importance_sampling_cap),
        )

    def applies(self, batch: Batch) -> bool:
        """Whether the batch is weighed: it carries sampler log-probs and the option is on."""
        return (
            batch.sampling_logprobs is not None and self.enabled and not self.clip_against_sampler
        )

    def weights(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> Any:
        """[N, T] truncated weights of ``old`` over ``sampling`` (both [N, T], ``mask`` [N, T])."""
        return rollout_weights(old, sampling, mask, cap=self.cap)[0]

    def batch_weights(self, batch: Batch, scores: Scores) -> torch.Tensor | None:
        """[N, T] the batch's weights from the scored ``old_logprobs``, or None.

        None where :meth:`weigh_batch` weighs nothing. Also read by an estimator that takes
        them (the optimal token baseline).
        """
        sampling = batch.sampling_logprobs
        if not self.applies(batch) or sampling is None or scores.old_logprobs is None:
            return None
        weights: torch.Tensor = self.weights(scores.old_logprobs, sampling, batch.mask)
        return weights

    def weigh_batch(self, batch: Batch, scores: Scores, estimates: Estimates) -> Estimates:
        """``estimates`` with the batch's weights from the scored ``old_logprobs`` [N, T].

        Unchanged when the correction does not apply or phase 3 scored no old log-probs (an
        on-policy update: :meth:`weigh_micro_batch` weighs each micro-batch instead).
        """
        weights = self.batch_weights(batch, scores)
        if weights is None:
            return estimates
        return dataclasses.replace(estimates, is_weights=weights)

    def weigh_micro_batch(self, mb: MicroBatch, logprobs: torch.Tensor) -> MicroBatch:
        """On-policy: ``mb`` weighed by its own ``logprobs`` [M, T] (detached: old = current)."""
        sampling = mb.sampling_logprobs if self.enabled else None
        if mb.old_logprobs is not None or mb.is_weights is not None or sampling is None:
            return mb
        weights = self.weights(logprobs.detach(), sampling, mb.mask)
        return dataclasses.replace(mb, is_weights=weights)
