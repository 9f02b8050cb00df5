"""The safetensors format read and written with torch alone.

rl-train does not declare ``safetensors``, and the format is small enough to write here.

A file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON header
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}`` and the tensors'
little-endian bytes (https://github.com/huggingface/safetensors#format). Files written here
load with ``safetensors.torch.load_file`` and the other way round; reading parses JSON and
copies bytes, nothing is executed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["load_tensors", "save_tensors"]

_CODES: Mapping[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def _raw(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` to ``path`` in the safetensors format."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.dtype not in _CODES:
            raise TypeError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors code")
        blob = _raw(tensor)
        header[name] = {
            "dtype": _CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for blob in blobs:
            out.write(blob)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file written by :func:`save_tensors` (or ``safetensors``)."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path} is not a safetensors file (too short)")
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    body = memoryview(data)[8 + size :]
    out: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        chunk = bytearray(body[begin:end])
        flat = torch.frombuffer(chunk, dtype=dtype) if chunk else torch.zeros(0, dtype=dtype)
        out[name] = flat.reshape(entry["shape"]).clone()
    return out
