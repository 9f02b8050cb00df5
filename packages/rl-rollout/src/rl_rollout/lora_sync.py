"""Adapter-only weight sync: a LoRA adapter as safetensors bytes, and its merge into base weights.

A trainer that trains LoRA adapters sends a rollout engine the adapter only, in peft's saved
form: tensors named ``base_model.model.<module>.lora_A.weight`` ([r, in]) and
``base_model.model.<module>.lora_B.weight`` ([out, r]) with peft's ``LoraConfig`` as a dict.
On the wire (:func:`adapter_to_bytes`) that is one safetensors file whose header metadata holds
the adapter's name, its weight version and the config as JSON: no pickle, no shared directory,
and the bytes moved are the tensors' bytes plus that header.

An engine without peft (rl-rollout does not depend on it) serves the adapter by merging it
(:func:`merged_weights`): each targeted linear layer gets the weight

    W' = W + s * B @ A,   s = lora_alpha / r   (rsLoRA: lora_alpha / sqrt(r))

(Hu et al. 2021, "LoRA", arXiv 2106.09685; Kalajdzievski 2023, "rsLoRA", arXiv 2312.03732),
computed in the order peft's ``get_delta_weight`` computes it, so the merged weight is the one a
trainer that samples with ``PolicyModel.merged_for_generation`` uses, bit for bit.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

__all__ = [
    "ADAPTER_FORMAT",
    "LoraAdapter",
    "adapter_from_bytes",
    "adapter_to_bytes",
    "merged_weights",
]

#: The ``format`` entry of an adapter payload's safetensors metadata.
ADAPTER_FORMAT = "rl-rollout-lora/1"

_KEY = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight")
# peft options that change what the adapter computes beyond W + s * B @ A
_UNSUPPORTED = ("use_dora", "lora_bias", "rank_pattern", "alpha_pattern", "modules_to_save")


@dataclass(frozen=True)
class LoraAdapter:
    """One version of a LoRA adapter, as a trainer sends it."""

    name: str
    """The adapter's name (e.g. ``"actor"``)."""
    version: int
    """The policy version (updates applied) of these tensors."""
    config: Mapping[str, Any]
    """peft's ``LoraConfig`` as a dict (``r``, ``lora_alpha``, ``use_rslora``, ...)."""
    tensors: Mapping[str, torch.Tensor]
    """peft's saved names -> tensors (``...lora_A.weight`` [r, in], ``...lora_B.weight``
    [out, r])."""

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def describe(self) -> str:
        """``adapter 'NAME' version V`` (for messages)."""
        return f"adapter {self.name!r} version {self.version}"


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str)
    return str(value)


def adapter_to_bytes(adapter: LoraAdapter) -> bytes:
    """The adapter as one safetensors file: its tensors, and name / version / config metadata.

    Raises:
        ValueError: no tensors, or an empty name.
    """
    if not adapter.tensors:
        raise ValueError(f"{adapter.describe()} has no tensors: nothing to sync")
    if not adapter.name:
        raise ValueError("the adapter's `name` is empty")
    metadata = {
        "format": ADAPTER_FORMAT,
        "name": adapter.name,
        "version": str(int(adapter.version)),
        "peft_config": json.dumps(dict(adapter.config), default=_json_default),
    }
    tensors = {k: t.detach().contiguous().cpu() for k, t in adapter.tensors.items()}
    return save_safetensors(tensors, metadata=metadata)


def adapter_from_bytes(data: bytes) -> LoraAdapter:
    """Inverse of :func:`adapter_to_bytes`.

    Raises:
        ValueError: not a safetensors payload of :data:`ADAPTER_FORMAT` (or one cut short), or a
            tensor that is not floating point or not finite.
    """
    if len(data) < 8:
        raise ValueError(f"the adapter payload has {len(data)} bytes: not a safetensors file")
    (size,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + size])
        metadata = dict(header.get("__metadata__") or {})
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"the adapter payload's safetensors header is unreadable: {exc}") from exc
    if metadata.get("format") != ADAPTER_FORMAT:
        raise ValueError(
            f"the payload is not an adapter of format {ADAPTER_FORMAT!r} (metadata "
            f"{sorted(metadata)}); send it with RemoteEngine.load_adapter"
        )
    try:
        tensors = load_safetensors(data)
    except Exception as exc:  # safetensors' own error type, e.g. a payload cut short
        raise ValueError(
            f"the adapter payload's tensors are unreadable ({exc}): a truncated or corrupted "
            "upload; send it again with RemoteEngine.load_adapter"
        ) from exc
    adapter = LoraAdapter(
        name=str(metadata["name"]),
        version=int(metadata["version"]),
        config=json.loads(metadata["peft_config"]),
        tensors=tensors,
    )
    for key in sorted(tensors):  # the first bad tensor by name, whatever the file's order
        _check_values(adapter, key, tensors[key])
    return adapter


def _check_values(adapter: LoraAdapter, key: str, tensor: torch.Tensor) -> None:
    """A LoRA tensor must hold finite floating-point numbers."""
    if not tensor.is_floating_point():
        raise ValueError(
            f"{adapter.describe()}: tensor {key!r} is {tensor.dtype}: LoRA tensors must be "
            "floating point (float32, bfloat16 or float16)"
        )
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(
            f"{adapter.describe()}: tensor {key!r} has values that are not finite (NaN or inf): "
            "the training step that made it diverged; sync a finite adapter"
        )


def _scaling(adapter: LoraAdapter) -> tuple[int, float]:
    """``(r, s)`` of the adapter's config (checked)."""
    cfg = adapter.config
    peft_type = str(cfg.get("peft_type", "LORA")).rsplit(".", 1)[-1]
    if peft_type.upper() != "LORA":
        raise ValueError(f"{adapter.describe()}: peft_type {peft_type!r} is not LORA")
    for key in _UNSUPPORTED:
        if cfg.get(key):
            raise ValueError(
                f"{adapter.describe()}: `{key}` = {cfg[key]!r} is not supported by adapter "
                "sync (plain LoRA: W + s * B @ A); train without it or sync full weights"
            )
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise ValueError(f"{adapter.describe()}: the config needs r >= 1 and lora_alpha")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return r, scale


def merged_weights(
    model: torch.nn.Module,
    adapter: LoraAdapter,
    base_weight: Callable[[str, torch.nn.Linear], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """``{module name: W + s * B @ A}`` for each linear layer of ``model`` the adapter targets.

    Every tensor is checked (names, modules, ranks, shapes) before anything is computed, so a
    refused adapter leaves nothing half-merged.

    Args:
        model: A plain transformers model (module names as in peft's ``base_model.model.``).
        adapter: The adapter.
        base_weight: The base ``W`` of a module (default: its current ``weight``); an engine
            that has swapped merged weights in passes the originals.

    Raises:
        ValueError: a tensor name that is not peft's LoRA form, a tensor that is not floating
            point or not finite, a module the model lacks or that is not linear (``unknown
            target module``), a rank other than the config's ``r`` or shapes that do not fit
            the layer (``wrong rank``), an A without its B.
    """
    r, scale = _scaling(adapter)
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter.tensors.items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise ValueError(
                f"{adapter.describe()}: tensor {key!r} is not peft's LoRA form "
                "'base_model.model.<module>.lora_A.weight' / '.lora_B.weight'"
            )
        _check_values(adapter, key, tensor)
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    for name, pair in sorted(pairs.items()):
        layer = modules.get(name)
        if not isinstance(layer, torch.nn.Linear):
            known = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)][:4]
            what = "lacks" if layer is None else f"has as a {type(layer).__name__}, not a Linear"
            raise ValueError(
                f"{adapter.describe()} targets module {name!r}, which the served model {what} "
                f"(unknown target module; its linear layers are named like {known}): the "
                "adapter belongs to another base model"
            )
        if set(pair) != {"A", "B"}:
            raise ValueError(
                f"{adapter.describe()}: module {name!r} has lora_{next(iter(pair))} only"
            )
        a, b = pair["A"], pair["B"]
        out_f, in_f = layer.weight.shape
        if adapter.config.get("fan_in_fan_out"):
            out_f, in_f = in_f, out_f
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r:
            raise ValueError(
                f"{adapter.describe()}: module {name!r} has lora_A {tuple(a.shape)} and lora_B "
                f"{tuple(b.shape)}, not rank r = {r} of its config (wrong rank)"
            )
        if a.shape[1] != in_f or b.shape[0] != out_f:
            raise ValueError(
                f"{adapter.describe()}: module {name!r} is [{out_f}, {in_f}], the adapter's "
                f"B @ A is [{b.shape[0]}, {a.shape[1]}]"
            )
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, pair in pairs.items():
            layer = modules[name]
            assert isinstance(layer, torch.nn.Linear)
            weight = layer.weight if base_weight is None else base_weight(name, layer)
            a = pair["A"].to(weight.device)
            b = pair["B"].to(weight.device)
            # as peft's get_delta_weight: low-precision CPU products in float32
            low = a.device.type == "cpu" and b.dtype in (torch.float16, torch.bfloat16)
            delta = (b.float() @ a.float()) if low else b @ a
            if adapter.config.get("fan_in_fan_out"):
                delta = delta.T
            delta = delta * scale
            if low:
                delta = delta.to(b.dtype)
            merged[name] = weight.detach() + delta.to(weight.dtype)
    return merged
