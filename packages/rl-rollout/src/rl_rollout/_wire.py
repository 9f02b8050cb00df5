"""JSON encodings shared by the rollout server and its client (no pickle anywhere)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rl_rollout.params import SamplingParams
from rl_rollout.result import RolloutResult

_FLOAT_DTYPES = {str(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}

__all__ = ["params_from_json", "params_to_json", "result_from_json", "result_to_json"]


def params_to_json(params: SamplingParams) -> dict[str, Any]:
    """``SamplingParams`` as JSON; the logit mask travels as the list of allowed token ids.

    Raises:
        ValueError: ``params.logits_processor`` is set (a Python callable cannot be sent).
    """
    if params.logits_processor is not None:
        raise ValueError(
            "`logits_processor` cannot be sent to a rollout server (it is a Python callable); "
            "use an in-process engine (HFEngine) for value-guided decoding"
        )
    out: dict[str, Any] = {}
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        if field.name == "logits_processor":
            continue
        if field.name == "logit_mask":
            value = None if value is None else [int(i) for i in value.nonzero().flatten()]
            out["allowed_token_ids"] = value
            out["vocab_size"] = (
                None if params.logit_mask is None else int(params.logit_mask.numel())
            )
            continue
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def params_from_json(data: dict[str, Any]) -> SamplingParams:
    """Inverse of :func:`params_to_json`."""
    data = dict(data)
    allowed = data.pop("allowed_token_ids", None)
    vocab = data.pop("vocab_size", None)
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown sampling parameters {unknown}; known: {sorted(known)}")
    for name in ("stop", "stop_token_ids"):
        if name in data:
            data[name] = tuple(data[name])
    if allowed is not None:
        mask = torch.zeros(int(vocab), dtype=torch.bool)
        mask[torch.tensor(allowed, dtype=torch.long)] = True
        data["logit_mask"] = mask
    return SamplingParams(**data)


def result_to_json(result: RolloutResult) -> dict[str, Any]:
    """A :class:`RolloutResult` as JSON lists (float32 log-probs round-trip exactly)."""
    return {
        "prompt_ids": result.prompt_ids.tolist(),
        "prompt_mask": result.prompt_mask.tolist(),
        "completion_ids": result.completion_ids.tolist(),
        "completion_mask": result.completion_mask.tolist(),
        "finish_reasons": list(result.finish_reasons),
        "group_index": result.group_index.tolist(),
        "texts": list(result.texts),
        "logprobs": None if result.logprobs is None else result.logprobs.tolist(),
        "logprobs_dtype": None if result.logprobs is None else str(result.logprobs.dtype),
        "weight_version": result.weight_version,
    }


def result_from_json(data: dict[str, Any]) -> RolloutResult:
    """Inverse of :func:`result_to_json`."""
    logprobs = None
    if data["logprobs"] is not None:
        dtype = _FLOAT_DTYPES[str(data["logprobs_dtype"])]
        logprobs = torch.tensor(data["logprobs"], dtype=dtype)
    return RolloutResult(
        prompt_ids=torch.tensor(data["prompt_ids"], dtype=torch.long),
        prompt_mask=torch.tensor(data["prompt_mask"], dtype=torch.bool),
        completion_ids=torch.tensor(data["completion_ids"], dtype=torch.long),
        completion_mask=torch.tensor(data["completion_mask"], dtype=torch.bool),
        finish_reasons=list(data["finish_reasons"]),
        group_index=torch.tensor(data["group_index"], dtype=torch.long),
        texts=list(data["texts"]),
        logprobs=logprobs,
        weight_version=data.get("weight_version"),
    )
