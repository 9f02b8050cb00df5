"""Tinker's named losses as rl-losses registry calls (:func:`rl_algos.objectives.policy_loss`).

Tinker (tinker-docs.thinkingmachines.ai/tinker/losses) computes every built-in loss per token
and **sums** it over the tokens of every ``Datum`` of the request (no mean). With ``lp`` the
learner's log-probs of ``target_tokens``, ``q`` the ``logprobs`` input (the sampler's), ``A``
the ``advantages`` and ``w`` the ``weights``:

==========================  ===========================================================
Tinker ``loss_fn``          documented loss (sum over tokens ``t``)
==========================  ===========================================================
``cross_entropy``           ``-sum w_t lp_t``
``importance_sampling``     ``-sum exp(lp_t - q_t) A_t``
``ppo``                     ``-sum min(r_t A_t, clip(r_t, lo, hi) A_t)``, ``r = exp(lp - q)``
``cispo``                   ``-sum sg(clip(r_t, lo, hi)) lp_t A_t``
``gspo``                    ``-sum min(s_t A_t, clip(s_t, lo, hi) A_t)``, ``s_t = sg(s) p/sg(p)``,
                            ``s = exp(mean_{t in M}(lp_t - q_t))`` (GSPO-token)
``dro``                     ``-sum (lp_t A_t - beta/2 (lp_t - q_t)^2)``
==========================  ===========================================================

``lo``/``hi`` are ``loss_fn_config``'s ``clip_low_threshold``/``clip_high_threshold``
(default 0.8 / 1.2: Tinker's fixed epsilon 0.2), ``beta`` is ``loss_fn_config["beta"]``
(default 0.05, the value of Tinker's example). Each maps onto one registered rl-losses
function with ``aggregation="seq_mean_token_sum"`` and a normaliser of 1, which is the plain
sum over the valid tokens (:func:`rl_losses.aggregate`): see :data:`MAPPING`. ``custom``
(Tinker runs it client-side by default, through ``forward`` and ``cross_entropy``) and any
name that is not in :data:`MAPPING` are refused with :class:`LossError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from rl_algos.batch import MicroBatch, Normalizers
from rl_algos.objectives import PolicyObjective, policy_loss, resolve_loss_name

from rl_train.tinker.futures import UserError

__all__ = ["MAPPING", "LossError", "LossSpec", "check_loss_inputs", "compute_loss", "loss_spec"]


class LossError(UserError):
    """A loss request the service cannot run (unknown name, missing or mismatched input)."""


@dataclass(frozen=True)
class LossSpec:
    """How one Tinker loss is computed with rl-losses."""

    registry: str
    """The :func:`rl_losses.get_policy_loss` name."""
    inputs: tuple[str, ...]
    """``loss_fn_inputs`` keys besides ``target_tokens`` that the loss needs."""
    config: tuple[str, ...]
    """``loss_fn_config`` keys it reads."""
    call: str
    """The call, for the docs' table."""


#: Tinker name -> the rl-losses function and arguments that reproduce its documented formula.
MAPPING: Mapping[str, LossSpec] = {
    "cross_entropy": LossSpec(
        "cross_entropy", ("weights",), (), "cross_entropy (reinforce_loss, form='logprob'), A = w"
    ),
    "importance_sampling": LossSpec(
        "importance_sampling",
        ("logprobs", "advantages"),
        (),
        "importance_sampling (clipped_surrogate, ratio_bounds=(0, inf))",
    ),
    "ppo": LossSpec(
        "ppo",
        ("logprobs", "advantages"),
        ("clip_low_threshold", "clip_high_threshold"),
        "ppo (clipped_surrogate, ratio_bounds=(lo, hi))",
    ),
    "cispo": LossSpec(
        "cispo",
        ("logprobs", "advantages"),
        ("clip_low_threshold", "clip_high_threshold"),
        "cispo (cispo_loss, clamp='two_sided', eps_low=1-lo, eps_high=hi-1)",
    ),
    "gspo": LossSpec(
        "gspo",
        ("logprobs", "advantages"),
        ("clip_low_threshold", "clip_high_threshold"),
        "gspo (gspo_loss, gradient='token', clip_low=1-lo, clip_high=hi-1), mask = M",
    ),
    "dro": LossSpec("dro", ("logprobs", "advantages"), ("beta",), "dro (dro_loss, beta)"),
}

#: Tinker's documented defaults of ``loss_fn_config``.
DEFAULT_CONFIG: Mapping[str, float] = {
    "clip_low_threshold": 0.8,
    "clip_high_threshold": 1.2,
    "beta": 0.05,
}

#: ``loss_fn_inputs`` keys a loss reads when given (besides ``target_tokens`` and its inputs).
OPTIONAL_INPUTS: Mapping[str, tuple[str, ...]] = {"gspo": ("sequence_ratio_mask",)}


def loss_spec(name: str) -> LossSpec:
    """The mapping of Tinker loss ``name``; :class:`LossError` for ``custom`` and unmapped names."""
    if name == "custom":
        raise LossError(
            "loss_fn 'custom' (a server-side custom loss) is not supported by this server; use "
            "TrainingClient.forward_backward_custom, which runs the loss client-side through "
            f"`forward` and `cross_entropy`. Supported: {sorted(MAPPING)}"
        )
    spec = MAPPING.get(name)
    if spec is None:
        raise LossError(
            f"loss_fn {name!r} is not supported by this server (no rl-losses function "
            f"reproduces it); supported: {sorted(MAPPING)}"
        )
    resolve_loss_name(spec.registry)  # registered in this rl-losses
    return spec


def check_loss_inputs(
    name: str, index: int, length: int, inputs: Mapping[str, torch.Tensor], forward_only: bool
) -> None:
    """Check datum ``index``'s ``loss_fn_inputs`` for loss ``name``; raise :class:`LossError`.

    Every tensor must be 1-D of the datum's ``model_input`` length ``N >= 1`` (position ``i``
    of ``model_input`` predicts ``target_tokens[i]``) and finite; a key the loss does not read
    is refused (it would be ignored).
    """
    spec = loss_spec(name)
    if length == 0:
        raise LossError(f"data[{index}].model_input is empty: a Datum needs at least one token")
    if "target_tokens" not in inputs:
        raise LossError(f"data[{index}]: loss_fn_inputs has no 'target_tokens' (shape ({length},))")
    needed = () if forward_only else spec.inputs
    for key in ("target_tokens", *needed):
        if key not in inputs and not (key == "weights" and name == "cross_entropy"):
            raise LossError(
                f"data[{index}]: loss_fn {name!r} needs loss_fn_inputs[{key!r}] (shape ({length},))"
            )
    read = ("target_tokens", *spec.inputs, *OPTIONAL_INPUTS.get(name, ()))
    for key, value in inputs.items():
        if key not in read:
            raise LossError(
                f"data[{index}]: loss_fn {name!r} does not read loss_fn_inputs[{key!r}]; it "
                f"reads {list(read)}: remove {key!r}"
                + (" (loss_fn_config takes the clip thresholds)" if "threshold" in key else "")
            )
        if value.ndim != 1 or value.shape[0] != length:
            raise LossError(
                f"data[{index}]: loss_fn_inputs[{key!r}] has shape {list(value.shape)} but "
                f"model_input has {length} tokens; every loss_fn_inputs tensor must have shape "
                f"({length},) (position i of model_input predicts target_tokens[i])"
            )
        if value.is_floating_point() and not bool(value.isfinite().all()):
            first = int((~value.isfinite()).nonzero()[0, 0])
            raise LossError(
                f"data[{index}]: loss_fn_inputs[{key!r}] holds NaN or infinite values (first at "
                f"position {first}); every value must be finite"
            )


def _config(config: Mapping[str, float | str] | None, spec: LossSpec) -> dict[str, float]:
    given = dict(config or {})
    unknown = sorted(set(given) - set(spec.config))
    if unknown:
        raise LossError(
            f"loss_fn_config keys {unknown} are not read by this loss; it reads {list(spec.config)}"
        )
    out = {k: DEFAULT_CONFIG[k] for k in spec.config}
    for key, value in given.items():
        if isinstance(value, str) or not math.isfinite(float(value)):
            raise LossError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
        out[key] = float(value)
    if "clip_low_threshold" in out and not (
        0.0 < out["clip_low_threshold"] <= 1.0 <= out["clip_high_threshold"]
    ):
        raise LossError(
            "loss_fn_config needs 0 < clip_low_threshold <= 1 <= clip_high_threshold, got "
            f"{out['clip_low_threshold']} and {out['clip_high_threshold']}"
        )
    return out


def _objective(name: str, spec: LossSpec, cfg: Mapping[str, float]) -> PolicyObjective:
    options: dict[str, Any] = {}
    level: str | None = "token"
    if name == "ppo":
        options["ratio_bounds"] = (cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    elif name == "cispo":
        options.update(
            clamp="two_sided",
            eps_low=1.0 - cfg["clip_low_threshold"],
            eps_high=cfg["clip_high_threshold"] - 1.0,
        )
    elif name == "gspo":
        level = None
        options.update(
            gradient="token",
            clip_low=1.0 - cfg["clip_low_threshold"],
            clip_high=cfg["clip_high_threshold"] - 1.0,
        )
    elif name == "dro":
        options["beta"] = cfg["beta"]
    return PolicyObjective(
        loss=spec.registry, options=options, aggregation="seq_mean_token_sum", level=level
    )


def compute_loss(
    name: str,
    config: Mapping[str, float | str] | None,
    logprobs: torch.Tensor,
    valid: torch.Tensor,
    inputs: Sequence[Mapping[str, torch.Tensor]],
) -> torch.Tensor:
    """Tinker's loss ``name`` summed over the batch, with gradient.

    Args:
        name: Tinker loss name (a key of :data:`MAPPING`).
        config: ``loss_fn_config``.
        logprobs: [B, N] learner log-probs of ``target_tokens`` (right-padded).
        valid: [B, N] bool, True at each datum's real positions.
        inputs: B datums' ``loss_fn_inputs`` (1-D arrays of their lengths).

    Returns:
        The scalar loss.
    """
    spec = loss_spec(name)
    cfg = _config(config, spec)

    def stacked(key: str, default: float) -> torch.Tensor:
        out = torch.full(logprobs.shape, default, dtype=logprobs.dtype)
        for i, datum in enumerate(inputs):
            if key in datum:
                out[i, : datum[key].shape[0]] = datum[key].to(out.dtype)
        return out.to(logprobs.device)

    mask = valid
    if name == "cross_entropy":
        advantages, old = stacked("weights", 1.0), None
    else:
        advantages, old = stacked("advantages", 0.0), stacked("logprobs", 0.0)
    if name == "gspo":  # the sequence ratio's tokens M: sequence_ratio_mask, else A != 0
        ratio_mask = stacked("sequence_ratio_mask", float("nan"))
        ratio_mask = torch.where(
            ratio_mask.isnan(), (advantages != 0).to(logprobs.dtype), ratio_mask
        )
        mask = valid & (ratio_mask != 0)
        outside = valid & ~mask & (advantages != 0)
        if bool(outside.any()):
            raise LossError(
                "loss_fn 'gspo': a token outside sequence_ratio_mask has a nonzero advantage; "
                "rl_losses.gspo_loss sums over the ratio's tokens, so give those tokens "
                "advantage 0 or include them in sequence_ratio_mask"
            )
    n = logprobs.shape[0]
    mb = MicroBatch(
        rows=torch.arange(n),
        input_ids=torch.zeros(n, 1, dtype=torch.long),
        attention_mask=torch.ones(n, 1, dtype=torch.long),
        mask=mask,
        old_logprobs=old,
        ref_logprobs=None,
        advantages=advantages,
        turn_ids=None,
        is_weights=None,
        sampling_logprobs=None,
        returns=None,
        old_values=None,
        turn_mask=None,
        token_rewards=None,
    )
    terms = policy_loss(_objective(name, spec, cfg), mb, logprobs, Normalizers(1.0, 1.0))
    return terms.loss
