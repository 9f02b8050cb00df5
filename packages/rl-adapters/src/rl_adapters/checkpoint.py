"""Checkpoints with no pickle: tensors in safetensors, everything else in JSON.

A checkpoint is a directory::

    actor/ reference/ critic/     PEFT adapter dirs (adapter_model.safetensors, adapter_config.json)
    value_head.safetensors        the critic's value head
    <name>.safetensors + .json    extra heads passed as ``heads={name: module}`` (e.g. ILQL's)
    model.safetensors             the whole model (full fine-tuning)
    optimizer.safetensors/.json   optimizer state: tensors / everything else
    scheduler.json (+ .safetensors)
    rng.safetensors + rng.json    torch CPU (and CUDA) generator states, Python ``random`` state
    state.json                    caller's JSON state (step counters, hyperparameters)
    manifest.json                 every file with size and sha256, roles, LoRA configs, base arch

It is written into a temporary sibling directory and renamed into place, so a crash while
saving never leaves a half-written directory under the checkpoint's name and never touches
the previous checkpoint until the new one is complete; only a previous checkpoint (or an empty
directory) is ever replaced. Loading verifies the manifest before reading anything, compares
the saved tensors' names and shapes with the model's before restoring any, and reads only
safetensors and JSON: ``torch.load`` is never called, so a planted pickle cannot execute.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_file
from torch import nn

from rl_adapters._checkpoint_fit import (
    _check_fits,
    _check_heads_fit,
    _check_weights,
    _describe,
    _head_config,
    _pad_to,
)
from rl_adapters._checkpoint_read import (
    CheckpointError,
    _check_rng_state,
    _load_structured,
    _load_tensors,
    _read_json,
)
from rl_adapters.policy import PolicyModel

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = "rl-adapters-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


# -- helpers ----------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=True) + "\n", "utf-8")


def _split_tensors(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace tensors in a nested structure by ``{"__tensor__": key}``, collecting them."""
    if isinstance(obj, torch.Tensor):
        key = prefix or "value"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {
            "__dict__": [
                [_split_tensors(k, "", {}), _split_tensors(v, f"{prefix}/{k}", tensors)]
                for k, v in obj.items()
            ]
        }
    if isinstance(obj, list | tuple):
        items = [_split_tensors(v, f"{prefix}/{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint (at {prefix or 'top'})")


def _save_structured(directory: Path, stem: str, obj: Any) -> None:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split_tensors(obj, "", tensors)
    if tensors:
        save_file(tensors, str(directory / f"{stem}.safetensors"))
    _write_json(directory / f"{stem}.json", skeleton)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


#: File stems used by the checkpoint itself: extra heads may not take these names.
_RESERVED_STEMS = {"value_head", "model", "optimizer", "scheduler", "rng", "state", "manifest"}


def _check_head_names(heads: Mapping[str, nn.Module]) -> None:
    for name, module in heads.items():
        if not name.isidentifier() or name in _RESERVED_STEMS or name in ("actor", "reference"):
            raise ValueError(
                f"`heads` key {name!r} must be a Python identifier other than "
                f"{sorted(_RESERVED_STEMS | {'actor', 'reference'})}"
            )
        if not isinstance(module, nn.Module):
            raise TypeError(f"`heads`[{name!r}] must be a torch.nn.Module, got {type(module)}")


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


# -- save --------------------------------------------------------------------------------------


def save_checkpoint(
    policy: PolicyModel,
    directory: str | os.PathLike[str],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    state: dict[str, Any] | None = None,
    heads: Mapping[str, nn.Module] | None = None,
) -> Path:
    """Save a policy (and optimizer, scheduler, RNG and caller state) atomically, without pickle.

    Args:
        policy: The :class:`PolicyModel`.
        directory: Target directory: absent, empty, or an existing checkpoint, which is
            replaced only once the new one is complete.
        optimizer: Optimizer whose state to save, or None.
        scheduler: LR scheduler (``state_dict()`` of JSON types and tensors), or None.
        state: JSON-serialisable caller state (step counters, hyperparameters), or None.
        heads: Extra modules kept beside the policy (e.g. ``{"ilql_heads": ILQLHeads}``):
            each is written as ``<name>.safetensors`` (its state dict) and ``<name>.json``
            (its class, ``config.to_dict()`` and tensor shapes), covered by the manifest.

    Returns:
        The checkpoint directory.

    Raises:
        TypeError: If ``state`` is not JSON-serialisable (nothing is written).
        CheckpointError: ``directory`` is a file, or a non-empty directory that is not an
            rl-adapters checkpoint (nothing is written or removed).
    """
    target = Path(directory)
    if state is not None:
        try:
            json.dumps(state, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"`state` must be JSON-serialisable: {exc}") from exc
    heads = dict(heads or {})
    _check_head_names(heads)
    target.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted_swap(target)
    _check_target(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _write_checkpoint(policy, tmp, optimizer, scheduler, state, heads)
        _fsync_tree(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            old.rmdir()
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _is_checkpoint(directory: Path) -> bool:
    """Whether ``directory`` holds a manifest of this format (what :func:`_verify` requires)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == CHECKPOINT_FORMAT


def _check_target(target: Path) -> None:
    """Refuse a save target that holds anything but a checkpoint (or an empty directory)."""
    if target.is_dir():
        if _is_checkpoint(target) or not any(target.iterdir()):
            return
        raise CheckpointError(
            f"`directory` {target} exists and is not an rl-adapters checkpoint (it has no "
            f"{MANIFEST} of format {CHECKPOINT_FORMAT!r}); choose another directory or delete it"
        )
    if target.exists() or target.is_symlink():
        raise CheckpointError(
            f"`directory` {target} exists and is not an rl-adapters checkpoint (it is a file or a "
            "broken link, not a directory); choose another directory or delete it"
        )


def _write_checkpoint(
    policy: PolicyModel,
    out: Path,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    state: dict[str, Any] | None,
    heads: Mapping[str, nn.Module] | None = None,
) -> None:
    if policy.peft is not None:
        for role in policy.adapter_roles:
            policy.peft.save_pretrained(str(out), selected_adapters=[role])
    else:
        save_file(_dedup_state(policy.causal_lm), str(out / "model.safetensors"), {"format": "pt"})
    if policy.value_head is not None:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()},
            str(out / "value_head.safetensors"),
        )
    for name, module in (heads or {}).items():
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()},
            str(out / f"{name}.safetensors"),
        )
        _write_json(out / f"{name}.json", _head_config(module))
    if optimizer is not None:
        _save_structured(out, "optimizer", optimizer.state_dict())
    if scheduler is not None:
        _save_structured(out, "scheduler", scheduler.state_dict())
    _save_structured(out, "rng", _rng_state())
    _write_json(out / "state.json", state if state is not None else {})
    files = {
        str(p.relative_to(out)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    described = {name: _head_config(m) for name, m in (heads or {}).items()}
    extra = {"heads": described} if described else {}
    header = {"format": CHECKPOINT_FORMAT, "version": FORMAT_VERSION}
    _write_json(out / MANIFEST, {**header, **_describe(policy), **extra, "files": files})


def _dedup_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors, copied to CPU, with tied weights saved once (first name kept).

    Copies rather than ``safetensors.save_model``: under DeepSpeed the parameters are views
    into flat buffers, which ``save_model`` refuses as shared storage. ``load_model`` prefers
    the saved names when it resolves the tied ones.
    """
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return out


def _recover_interrupted_swap(target: Path) -> None:
    """If a save died between moving the old checkpoint aside and moving the new one in."""
    if target.exists():
        return
    backups = sorted(target.parent.glob(f".{target.name}.old-*"), key=os.path.getmtime)
    for backup in reversed(backups):
        if (backup / MANIFEST).is_file():
            os.rename(backup, target)
            warnings.warn(f"restored {target} from the interrupted save's backup", stacklevel=3)
            return


# -- load --------------------------------------------------------------------------------------


def _verify(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory at {directory}")
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(
            f"{directory} is incomplete or not a checkpoint: {MANIFEST} is missing (a save that "
            "did not finish never writes it)"
        )
    manifest = _read_json(manifest_path)
    if manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{manifest_path} is not an {CHECKPOINT_FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(info, dict)
        and isinstance(info.get("size"), int)
        and isinstance(info.get("sha256"), str)
        for info in files.values()
    ):
        raise CheckpointError(
            f"{manifest_path} is malformed: 'files' must map every file name to its "
            "{'size': int, 'sha256': str}; restore the checkpoint from a copy or save it again"
        )
    for name, info in files.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {name} listed in the manifest is missing")
        if path.suffix not in (".safetensors", ".json", ".md"):
            raise CheckpointError(
                f"checkpoint file {name} is not safetensors, JSON or a peft model card; refusing "
                "it (checkpoints never hold pickles)"
            )
        if path.stat().st_size != info["size"] or _sha256(path) != info["sha256"]:
            raise CheckpointError(f"checkpoint file {name} is corrupted (size or sha256 mismatch)")
    return dict(manifest)


def _load_heads(heads: Mapping[str, nn.Module], root: Path) -> None:
    for name, module in heads.items():
        tensors = _load_tensors(root / f"{name}.safetensors")  # checked by _check_weights
        module.load_state_dict(tensors)  # copies into the existing tensors: requires_grad kept


def load_checkpoint(
    policy: PolicyModel,
    directory: str | os.PathLike[str],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    merge_lora_config: bool = False,
    heads: Mapping[str, nn.Module] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``policy`` (and the rest).

    The manifest is verified first (every file present, right size and sha256, only
    safetensors/JSON), then the base architecture (class, type, hidden and vocabulary sizes,
    layers, attention and key/value heads, MLP size), the roles and the LoRA config are
    compared with ``policy``, then the names and shapes of every saved tensor with the ones
    ``policy`` holds; any mismatch raises :class:`CheckpointError` (a ``ValueError``) showing
    both sides, before any weight is restored. Nothing is unpickled.

    Args:
        policy: A :class:`PolicyModel` built like the saved one (same base architecture).
        directory: The checkpoint directory.
        optimizer: Optimizer to restore (built over the same parameters), or None.
        scheduler: Scheduler to restore, or None.
        merge_lora_config: When the LoRA configs differ only in rank and target modules,
            rebuild ``policy``'s adapters with the larger rank and the union of the targets
            (scaling matched to the saved adapters) and load the saved weights zero-padded, so
            they compute exactly what they did; modules only the model targets start as no-ops.
            Optimizers over the old adapter parameters must be rebuilt (so ``optimizer`` must be
            None when a merge happens).
        heads: Extra modules saved with ``save_checkpoint(..., heads=...)``, by the same names;
            each must be in the checkpoint with the same class and tensor shapes (other
            settings in its ``config``, e.g. a Polyak rate, may differ and stay the module's).

    Returns:
        The caller ``state`` that was saved.

    Raises:
        CheckpointError: The checkpoint is incomplete, corrupted or does not fit ``policy``;
            a JSON file of it (``manifest.json``, ``state.json``, ``optimizer.json``,
            ``scheduler.json``, ``rng.json``) that cannot be read, is not JSON (e.g.
            truncated) or holds the wrong type is named by its path. JSON files are read
            before anything is restored, so such a failure leaves ``policy`` untouched, as
            does a base architecture or a set of saved tensors (names, shapes) that does not
            fit ``policy``. (With ``merge_lora_config`` the adapters are rebuilt before the
            tensors are compared.)
    """
    root = Path(directory)
    _recover_interrupted_swap(root)
    manifest = _verify(root)
    # every JSON file is parsed before anything is restored, so a bad one changes nothing
    if optimizer is not None and not (root / "optimizer.json").is_file():
        raise CheckpointError(f"{root} holds no optimizer state")
    if scheduler is not None and not (root / "scheduler.json").is_file():
        raise CheckpointError(f"{root} holds no scheduler state")
    optimizer_state = _load_structured(root, "optimizer") if optimizer is not None else None
    scheduler_state = _load_structured(root, "scheduler") if scheduler is not None else None
    rng_state = _load_structured(root, "rng")
    _check_rng_state(rng_state, root / "rng.json")
    state = _read_json(root / "state.json")
    before = policy.lora_config
    heads = dict(heads or {})
    _check_head_names(heads)
    _check_heads_fit(heads, manifest)  # before _check_fits, which may rebuild the adapters
    _check_fits(policy, manifest, merge=merge_lora_config)
    merged = policy.lora_config is not before
    if merged and optimizer is not None:
        raise CheckpointError(
            "the LoRA config was merged, so the optimizer's parameters no longer exist; load "
            "without `optimizer` and build a new one over policy.trainable_parameters()"
        )
    _check_weights(policy, root, heads, merged)
    if policy.peft is not None:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        for role in policy.adapter_roles:
            saved = _load_tensors(root / role / "adapter_model.safetensors")
            if merged:
                current = get_peft_model_state_dict(policy.peft, adapter_name=role)
                saved = _pad_to(saved, {k: v.shape for k, v in current.items()})
            set_peft_model_state_dict(policy.peft, saved, adapter_name=role)
    else:
        load_model(policy.causal_lm, str(root / "model.safetensors"))
    if policy.value_head is not None:
        policy.value_head.load_state_dict(_load_tensors(root / "value_head.safetensors"))
    _load_heads(heads, root)
    if optimizer is not None and optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    if scheduler is not None and scheduler_state is not None:
        scheduler.load_state_dict(scheduler_state)
    _set_rng_state(rng_state)
    policy._restore()
    return state
