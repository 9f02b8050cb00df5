"""JSON encodings of what the rollout server and its client exchange (no pickle anywhere)."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rl_rollout._prompts import Prompts
from rl_rollout.params import SamplingParams
from rl_rollout.result import RolloutResult

_FLOAT_DTYPES = {str(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}

__all__ = [
    "params_from_json",
    "params_to_json",
    "prompts_to_json",
    "result_from_json",
    "result_to_json",
]


def prompts_to_json(prompts: Prompts) -> Any:
    """Prompts as JSON, passed on as they are (the server's checks answer a bad shape)."""
    if isinstance(prompts, str):
        return prompts
    out: list[Any] = []
    for prompt in prompts:
        tolist = getattr(prompt, "tolist", None)  # a tensor or array of ids, or one id
        if callable(tolist):
            out.append(tolist())
        elif isinstance(prompt, (str, int, float)) or not isinstance(prompt, Iterable):
            out.append(prompt)
        else:
            out.append(list(prompt))
    return out


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
    """Inverse of :func:`params_to_json`.

    Raises:
        ValueError: not a JSON object, an unknown field, or a value ``SamplingParams`` refuses
            (the same message as in-process, naming the field).
    """
    if not isinstance(data, dict):
        raise ValueError(f"`params` must be a JSON object, got {type(data).__name__}")
    data = dict(data)
    allowed = data.pop("allowed_token_ids", None)
    vocab = data.pop("vocab_size", None)
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown sampling parameters {unknown}; known: {sorted(known)}")
    for name in ("stop", "stop_token_ids"):
        if isinstance(data.get(name), list):  # anything else reaches SamplingParams' own check
            data[name] = tuple(data[name])
    if allowed is not None:
        if not (
            isinstance(vocab, int)
            and isinstance(allowed, list)
            and all(isinstance(i, int) and 0 <= i < vocab for i in allowed)
        ):
            raise ValueError(
                "`allowed_token_ids` must be a list of token ids below `vocab_size` (an int), "
                f"got vocab_size={vocab!r}"
            )
        mask = torch.zeros(vocab, dtype=torch.bool)
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
        "routes": None if result.routes is None else _routes_to_json(result.routes),
    }


def _routes_to_json(routes: torch.Tensor) -> str:
    """[N, P + T, Y, k] int16 routes as a safetensors payload in base64 (a JSON list of lists
    would be about 3x the bytes for a real model's layers and experts).
    """  # noqa: D205
    payload = save_safetensors({"routes": routes.to(torch.int16).contiguous().cpu()})
    return base64.b64encode(payload).decode()


def _routes_from_json(data: Any, rows: int, width: int) -> torch.Tensor:
    """Inverse of :func:`_routes_to_json`, checked to be ``[rows, width, Y, k]`` int16."""
    try:
        routes = load_safetensors(base64.b64decode(str(data), validate=True))["routes"]
    except Exception as exc:  # binascii's, safetensors' or a missing key: a bad reply
        raise ValueError(
            f"`routes` must be a base64 safetensors payload of one int16 tensor 'routes' ({exc})"
        ) from exc
    if routes.dtype != torch.int16 or routes.dim() != 4 or tuple(routes.shape[:2]) != (rows, width):
        raise ValueError(
            f"`routes` {routes.dtype} {tuple(routes.shape)} must be int16 [rows, prompt + "
            f"completion length, layers, k] = [{rows}, {width}, Y, k]"
        )
    return routes


_RESULT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                "finish_reasons", "group_index", "texts", "logprobs")  # fmt: skip


def result_from_json(data: dict[str, Any]) -> RolloutResult:
    """Inverse of :func:`result_to_json`, with the shapes checked against each other.

    Raises:
        ValueError: not a JSON object, a missing field, or fields whose shapes disagree (prompt
            and completion rows, ids and masks, one finish reason, text and group per row).
    """
    if not isinstance(data, dict):
        raise ValueError(f"a result must be a JSON object, got {type(data).__name__}")
    missing = [key for key in _RESULT_KEYS if key not in data]
    if missing:
        raise ValueError(f"a result needs the fields {missing}")
    logprobs = None
    if data["logprobs"] is not None:
        dtype = _FLOAT_DTYPES.get(str(data.get("logprobs_dtype")))
        if dtype is None:
            raise ValueError(f"unknown `logprobs_dtype` {data.get('logprobs_dtype')!r}")
        logprobs = torch.tensor(data["logprobs"], dtype=dtype)
    result = RolloutResult(
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
    _check_shapes(result)
    if data.get("routes") is not None:
        rows, width = result.completion_ids.shape[0], result.sequences.shape[1]
        result.routes = _routes_from_json(data["routes"], rows, width)
    return result


def _check_shapes(result: RolloutResult) -> None:
    for name in ("prompt", "completion"):
        ids, mask = getattr(result, f"{name}_ids"), getattr(result, f"{name}_mask")
        if ids.ndim != 2 or ids.shape != mask.shape:
            raise ValueError(
                f"`{name}_ids` {tuple(ids.shape)} and `{name}_mask` {tuple(mask.shape)} must "
                "be [rows, length] of one shape"
            )
    rows = result.completion_ids.shape[0]
    sizes = {
        "prompt_ids": result.prompt_ids.shape[0],
        "finish_reasons": len(result.finish_reasons),
        "texts": len(result.texts),
        "group_index": result.group_index.numel() if result.group_index.ndim == 1 else -1,
    }
    wrong = {name: size for name, size in sizes.items() if size != rows}
    if wrong:
        raise ValueError(f"`completion_ids` has {rows} rows but {wrong} (one per row)")
    if result.logprobs is not None and result.logprobs.shape != result.completion_ids.shape:
        raise ValueError(
            f"`logprobs` {tuple(result.logprobs.shape)} must have the shape of `completion_ids` "
            f"{tuple(result.completion_ids.shape)}"
        )
