"""Whether a checkpoint fits a model: what the manifest records of it, and the checks on load.

Private to :mod:`rl_adapters.checkpoint`. :func:`_describe` and :func:`_head_config` are what
a save records about the model and its extra heads; on load the manifest is compared with them
(base architecture, roles, LoRA config, heads), then every saved tensor's name and shape (from
the safetensors headers) with the model's, all before any weight is restored. A LoRA config
that differs only in rank and target modules can be merged instead (``merge_lora_config``):
:func:`_merged_config` grows the model's and :func:`_pad_to` zero-pads the saved weights.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rl_adapters._checkpoint_read import CheckpointError, _tensor_shapes
from rl_adapters.lora import comparable_lora_config

if TYPE_CHECKING:
    from peft import LoraConfig

    from rl_adapters.policy import PolicyModel

#: Config fields that fix the base's tensor shapes, compared on load when the manifest has them.
_ARCH_FIELDS = (
    "model_class",
    "model_type",
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)
#: Those every manifest has; the others were added later and are skipped when absent.
_ARCH_FIELDS_ALWAYS = {"model_class", "model_type", "hidden_size", "vocab_size"}


# -- what a save records -----------------------------------------------------------------------


def _describe(policy: PolicyModel) -> dict[str, Any]:
    """The model as the manifest records it: base architecture, roles and LoRA config."""
    config = policy.causal_lm.config
    lora = comparable_lora_config(policy.lora_config) if policy.lora_config is not None else None
    return {
        "model_class": type(policy.causal_lm).__name__,
        "model_type": getattr(config, "model_type", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "num_attention_heads": getattr(config, "num_attention_heads", None),
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "intermediate_size": getattr(config, "intermediate_size", None),
        "full_finetune": policy.full_finetune,
        "reference": policy.reference_mode,
        "critic": policy.has_critic,
        "roles": list(policy.roles),
        "lora_config": lora,
    }


def _head_config(module: nn.Module) -> dict[str, Any]:
    """A head's JSON description: class, ``config.to_dict()`` (if any) and tensor shapes."""
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    described = to_dict() if callable(to_dict) else {}
    shapes = {k: list(v.shape) for k, v in module.state_dict().items()}
    return {"class": type(module).__name__, "config": described, "shapes": shapes}


# -- the manifest against the model ------------------------------------------------------------


def _check_fits(policy: PolicyModel, manifest: dict[str, Any], merge: bool = False) -> None:
    mine = _describe(policy)
    for key in _ARCH_FIELDS:
        if key not in _ARCH_FIELDS_ALWAYS and key not in manifest:
            continue  # a manifest written before the field was recorded
        if manifest.get(key) != mine[key]:
            raise CheckpointError(
                f"checkpoint is for a different base architecture: {key} = {manifest.get(key)!r} "
                f"in the checkpoint, {mine[key]!r} in this model"
            )
    for key in ("full_finetune", "reference", "critic"):
        if manifest.get(key) != mine[key]:
            raise CheckpointError(
                f"checkpoint has {key} = {manifest.get(key)!r} but this model has {mine[key]!r}"
            )
    if manifest.get("lora_config") != mine["lora_config"]:
        if merge and policy.peft is not None:
            policy.rebuild_adapters(_merged_config(policy, manifest["lora_config"]))
            return
        raise CheckpointError(
            "LoRA config mismatch:\n"
            f"  checkpoint: {json.dumps(manifest.get('lora_config'), sort_keys=True)}\n"
            f"  model:      {json.dumps(mine['lora_config'], sort_keys=True)}"
        )


def _check_heads_fit(heads: Mapping[str, nn.Module], manifest: dict[str, Any]) -> None:
    saved = manifest.get("heads", {})
    for name, module in heads.items():
        if name not in saved:
            raise CheckpointError(
                f"the checkpoint holds no head {name!r} (it has {sorted(saved) or 'none'}); it "
                "was saved without `heads=`"
            )
        mine = _head_config(module)
        # the structure must match; settings such as a Polyak rate may differ
        if (saved[name]["class"], saved[name]["shapes"]) != (mine["class"], mine["shapes"]):
            raise CheckpointError(
                f"head {name!r} does not fit:\n"
                f"  checkpoint: {json.dumps(saved[name], sort_keys=True)}\n"
                f"  model:      {json.dumps(mine, sort_keys=True)}"
            )


#: LoRA fields ``merge_lora_config`` may reconcile; any other difference still raises.
_MERGEABLE = {"r", "lora_alpha", "target_modules"}


def _merged_config(policy: PolicyModel, saved: dict[str, Any]) -> LoraConfig:
    """The model's LoRA config grown to hold the saved adapters: max rank, union of targets.

    ``lora_alpha`` is set so that the scaling (alpha / r, or alpha / sqrt(r) with rsLoRA)
    equals the saved adapters', so their zero-padded weights compute exactly what they did.
    """
    assert policy.lora_config is not None
    mine = comparable_lora_config(policy.lora_config)
    other = {k for k in mine if mine[k] != saved.get(k)} - _MERGEABLE
    if other:
        raise CheckpointError(
            f"LoRA configs differ in {sorted(other)}; merge_lora_config only reconciles the rank "
            "and the target modules"
        )
    targets = [mine["target_modules"], saved["target_modules"]]
    if any(not isinstance(x, list) for x in targets):
        raise CheckpointError("cannot merge target modules given as a pattern or 'all-linear'")
    rank = max(int(mine["r"]), int(saved["r"]))
    ratio = rank / int(saved["r"])
    alpha = float(saved["lora_alpha"]) * (ratio**0.5 if saved.get("use_rslora") else ratio)
    merged = copy.deepcopy(policy.lora_config)
    merged.r = rank
    merged.lora_alpha = alpha  # type: ignore[assignment]  # peft scales by alpha / r at runtime; floats work
    merged.target_modules = sorted(set(targets[0]) | set(targets[1]))
    return merged


def _pad_to(
    weights: dict[str, torch.Tensor], shapes: dict[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Zero-pad LoRA A rows / B columns of saved weights up to the model's rank."""
    out = {}
    for key, value in weights.items():
        if key not in shapes:
            raise CheckpointError(f"saved adapter weight {key} has no place in the merged model")
        target = shapes[key]
        padded = value.new_zeros(target)
        padded[tuple(slice(0, n) for n in value.shape)] = value
        out[key] = padded
    return out


# -- the saved tensors against the model's -----------------------------------------------------


def _few(items: list[str], shown: int = 3) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _check_tensors(
    name: str,
    saved: Mapping[str, list[int]],
    expected: Mapping[str, list[int]],
    padded: bool = False,
) -> None:
    """Raise unless the tensors of checkpoint file ``name`` are the ones the model holds.

    With ``padded`` (a merged LoRA config) the model may hold more tensors and larger ones: the
    saved weights are zero-padded into them.
    """
    missing = [] if padded else sorted(expected.keys() - saved.keys())
    unexpected = sorted(saved.keys() - expected.keys())
    shapes = [
        f"{key} {saved[key]} saved, {expected[key]} in the model"
        for key in sorted(saved.keys() & expected.keys())
        if saved[key] != expected[key]
        and not (
            padded
            and len(saved[key]) == len(expected[key])
            and all(s <= e for s, e in zip(saved[key], expected[key], strict=True))
        )
    ]
    found = (("missing keys", missing), ("unexpected keys", unexpected), ("shapes", shapes))
    problems = [f"{label}: {_few(items)}" for label, items in found if items]
    if problems:
        raise CheckpointError(
            f"checkpoint file {name} does not fit this model ({'; '.join(problems)}); load it "
            "into a model built like the saved one (same base architecture, LoRA config, roles)"
        )


def _shapes(state: Mapping[str, torch.Tensor]) -> dict[str, list[int]]:
    return {key: list(value.shape) for key, value in state.items()}


def _full_model_shapes(model: nn.Module, saved: Mapping[str, Any]) -> dict[str, list[int]]:
    """The model's tensor shapes under the names ``load_model`` reads them by.

    One name per group of tied tensors: the saved one where there is one, else the first (the
    one ``rl_adapters.checkpoint._dedup_state`` keeps).
    """
    state = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(id(tensor), []).append(key)
    chosen = [next((k for k in keys if k in saved), keys[0]) for keys in groups.values()]
    return {key: list(state[key].shape) for key in chosen}


def _check_weights(
    policy: PolicyModel, root: Path, heads: Mapping[str, nn.Module], merged: bool
) -> None:
    """Compare every saved tensor's name and shape (from the file headers) with the model's.

    Runs before anything is restored, so a checkpoint that does not fit changes nothing.
    """
    if policy.peft is not None:
        from peft import get_peft_model_state_dict

        for role in policy.adapter_roles:
            weights = root / role / "adapter_model.safetensors"
            if not weights.is_file():
                raise CheckpointError(f"adapter directory {root / role} is missing its weights")
            mine = get_peft_model_state_dict(policy.peft, adapter_name=role)
            saved = _tensor_shapes(weights)
            _check_tensors(f"{role}/{weights.name}", saved, _shapes(mine), padded=merged)
    else:
        saved = _tensor_shapes(root / "model.safetensors")
        _check_tensors("model.safetensors", saved, _full_model_shapes(policy.causal_lm, saved))
    modules = {"value_head": policy.value_head} if policy.value_head is not None else {}
    for name, module in {**modules, **heads}.items():
        saved = _tensor_shapes(root / f"{name}.safetensors")
        _check_tensors(f"{name}.safetensors", saved, _shapes(module.state_dict()))
