"""Reading a checkpoint's files back (private to :mod:`rl_adapters.checkpoint`).

Only safetensors and JSON are read, so nothing is unpickled; every failure to read or parse a
file is a :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint is incomplete, corrupted or does not fit the model, or a path is not one."""


def _read_json(path: Path) -> dict[str, Any]:
    """Parse a checkpoint's JSON file, which must hold an object.

    Raises:
        CheckpointError: The file cannot be read, is not UTF-8, is not JSON (corrupted or
            truncated) or holds something other than a JSON object; the message names the path.
    """
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CheckpointError(
            f"cannot read checkpoint file {path}: {exc.strerror or exc}; check its permissions "
            "or restore the checkpoint from a copy"
        ) from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"checkpoint file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); it is "
            "corrupted: restore the checkpoint from a copy or save it again"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"checkpoint file {path} is not valid JSON ({exc.msg} at line {exc.lineno}, column "
            f"{exc.colno}); it is corrupted or truncated: restore the checkpoint from a copy or "
            "save it again"
        ) from exc
    if not isinstance(data, dict):
        raise CheckpointError(
            f"checkpoint file {path} holds a JSON {type(data).__name__}, not the JSON object it "
            "was saved with; it is corrupted or not from this checkpoint"
        )
    return data


def _join_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_join_tensors(v, tensors) for v in obj["__tuple__"])
        if "__dict__" in obj:
            return {
                _join_tensors(k, tensors): _join_tensors(v, tensors) for k, v in obj["__dict__"]
            }
    if isinstance(obj, list):
        return [_join_tensors(v, tensors) for v in obj]
    return obj


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; any failure is a :class:`CheckpointError` naming the file."""
    try:
        return load_file(str(path))
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint file {path.name} is not valid safetensors: {exc}"
        ) from exc


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Names and shapes of a safetensors file's tensors, read from its header (no tensor data).

    Raises:
        CheckpointError: The file is not valid safetensors; the message names it.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            names = f.keys()
            return {key: list(f.get_slice(key).get_shape()) for key in names}
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint file {path.name} is not valid safetensors: {exc}"
        ) from exc


def _load_structured(directory: Path, stem: str) -> dict[str, Any]:
    """Rebuild what :func:`_save_structured` wrote (a state dict: tensors put back in place).

    Raises:
        CheckpointError: ``<stem>.json`` is unreadable or malformed, or refers to tensors
            ``<stem>.safetensors`` does not hold; the message names the files.
    """
    tensor_file = directory / f"{stem}.safetensors"
    tensors = _load_tensors(tensor_file) if tensor_file.exists() else {}
    json_file = directory / f"{stem}.json"
    skeleton = _read_json(json_file)
    try:
        obj = _join_tensors(skeleton, tensors)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint file {json_file} is malformed or does not match {tensor_file.name} "
            f"({type(exc).__name__}: {exc}); restore the checkpoint from a copy or save it again"
        ) from exc
    if not isinstance(obj, dict):
        raise CheckpointError(
            f"checkpoint file {json_file} holds a {type(obj).__name__}, not the state dict it "
            "was saved with"
        )
    return obj


def _check_rng_state(state: dict[str, Any], path: Path) -> None:
    python = state.get("python")
    if not isinstance(state.get("torch"), torch.Tensor) or not (
        isinstance(python, tuple) and len(python) == 3 and isinstance(python[1], list | tuple)
    ):
        raise CheckpointError(
            f"checkpoint file {path} does not hold the RNG states it was saved with (torch "
            "generator state and Python random state); restore the checkpoint from a copy or "
            "save it again"
        )
