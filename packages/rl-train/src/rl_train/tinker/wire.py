"""The protobuf side of the Tinker API, with the schema the SDK ships (``tinker.proto``).

``forward_backward`` requests arrive as ``tinker_public_pb2.ForwardBackwardRequest`` (zstd
compressed when the server's client config asks for it; this server does not), and the SDK
reads ``ForwardBackwardOutput`` and ``SampleResponse`` results as protobuf when it sends
``Accept: application/x-protobuf``. The decoding here mirrors ``tinker.proto.request_conv``
and the encoding ``tinker.proto.response_conv`` of the SDK release in the ``tinker`` extra.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from tinker.proto import tinker_public_pb2 as pb

from rl_train.tinker.futures import UserError

__all__ = [
    "FwdBwdRequest",
    "WireDatum",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
]

_DTYPES: Mapping[int, torch.dtype] = {
    pb.DTYPE_FLOAT32: torch.float32,
    pb.DTYPE_INT64: torch.int64,
    pb.DTYPE_INT32: torch.int32,
}


def _frombuffer(data: bytes, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor over a copy of ``data`` (little-endian, as the SDK writes)."""
    if not data:
        return torch.zeros(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype)


def to_bytes(tensor: torch.Tensor, dtype: torch.dtype) -> bytes:
    """The raw bytes of ``tensor`` cast to ``dtype``."""
    flat = tensor.detach().to(dtype).contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


@dataclass(frozen=True)
class WireDatum:
    """One ``Datum``: its tokens ``[N]`` and ``loss_fn_inputs`` (1-D arrays, as sent)."""

    tokens: torch.Tensor
    """[N] int64."""
    inputs: dict[str, torch.Tensor]


@dataclass(frozen=True)
class FwdBwdRequest:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _tensor(msg: pb.Tensor, where: str) -> torch.Tensor:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise UserError(f"{where}: unsupported tensor dtype {msg.dtype} (float32 or int64)")
    shape = [int(s) for s in msg.shape]
    if msg.HasField("sparse_csr"):
        values = _frombuffer(msg.sparse_csr.values, dtype)
        crow = _frombuffer(msg.sparse_csr.crow_indices, torch.int64)
        col = _frombuffer(msg.sparse_csr.col_indices, torch.int64)
        if len(shape) != 2 or len(crow) != shape[0] + 1:
            raise UserError(f"{where}: a sparse CSR tensor needs a 2-D shape, got {shape}")
        dense = torch.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            lo, hi = int(crow[row]), int(crow[row + 1])
            dense[row, col[lo:hi]] = values[lo:hi]
        return dense
    flat = _frombuffer(msg.dense, dtype)
    if shape and math.prod(shape) != flat.numel():
        raise UserError(f"{where}: shape {shape} does not match its {flat.numel()} values")
    return flat.reshape(shape) if shape else flat


def decode_forward_backward(body: bytes) -> FwdBwdRequest:
    """Parse a ``forward_backward`` request body; :class:`UserError` if it is not one."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:
        raise UserError(f"forward_backward body is not a ForwardBackwardRequest: {exc}") from None
    data: list[WireDatum] = []
    for i, datum in enumerate(msg.data):
        tokens: list[torch.Tensor] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise UserError(
                    f"data[{i}]: model_input chunk {kind!r} is not supported (text tokens only)"
                )
            tokens.append(_frombuffer(chunk.encoded_text.tokens, torch.int32))
        inputs = {
            name: _tensor(t, f"data[{i}].loss_fn_inputs[{name!r}]")
            for name, t in datum.loss_fn_inputs.items()
        }
        joined = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.int32)
        data.append(WireDatum(joined.to(torch.int64), inputs))
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    return FwdBwdRequest(
        model_id=msg.model_id,
        seq_id=int(msg.seq_id),
        loss_fn=msg.loss_fn,
        loss_fn_config=config,
        forward_only=bool(msg.forward_only),
        data=data,
    )


def _batched(arrays: Sequence[torch.Tensor], dtype: pb.DType.ValueType) -> pb.BatchedTensor:
    parts = [to_bytes(a, _DTYPES[dtype]) for a in arrays]
    offsets = torch.tensor([0, *itertools.accumulate(len(p) for p in parts)], dtype=torch.int64)
    return pb.BatchedTensor(
        data=b"".join(parts), offsets=to_bytes(offsets, torch.int64), dtype=dtype
    )


def encode_forward_backward_output(
    outputs: Sequence[Mapping[str, torch.Tensor]], metrics: Mapping[str, float]
) -> bytes:
    """A ``ForwardBackwardOutput``: one ``ArrayRecord`` of float32 fields per datum."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    record = out.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else ():
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs], pb.DTYPE_FLOAT32))
    data: bytes = out.SerializeToString()
    return data


@dataclass(frozen=True)
class SampledTokens:
    """One sampled sequence: its tokens, their log-probs and why it stopped."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    stop_reason: str


def encode_sample_response(
    sequences: Sequence[SampledTokens], prompt_logprobs: torch.Tensor | None
) -> bytes:
    """A ``SampleResponse`` (``prompt_logprobs`` NaN at position 0, read as None by the SDK)."""
    out = pb.SampleResponse()
    for seq in sequences:
        out.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=to_bytes(seq.tokens, torch.int32),
            logprobs=to_bytes(seq.logprobs, torch.float32),
        )
    if prompt_logprobs is not None:
        out.prompt_logprobs = to_bytes(prompt_logprobs, torch.float32)
    data: bytes = out.SerializeToString()
    return data
