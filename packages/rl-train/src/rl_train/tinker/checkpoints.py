"""Checkpoints of training clients: tensors in safetensors, everything else in JSON; no pickle.

``save_state`` writes ``tinker://<model_id>/weights/<name>`` (adapter and AdamW state),
``save_weights_for_sampler`` ``tinker://<model_id>/sampler_weights/<name>`` (adapter only).
Both are directories under the server's ``checkpoint_dir``::

    <checkpoint_dir>/<model_id>/<weights | sampler_weights>/<name>/
        adapter.safetensors     lora tensors, keyed without the adapter name
        optimizer.safetensors   AdamW moments and step counts (weights/ only, once stepped)
        checkpoint.json         base model, LoRA shape, steps, AdamW hyper-parameters,
                                expiry (``ttl_seconds``) and ``user_metadata``

so a server started again on the same ``checkpoint_dir`` loads them: ``load_state`` (and
``create_training_client_from_state``) rebuilds a client from them, ``create_sampling_client``
samples from them. Loading reads only these files with ``safetensors`` and ``json``, and
refuses a checkpoint of another base model, an expired one and one it cannot read with a
:class:`UserError`. ``save_state`` keeps an existing checkpoint of the same name unless
``overwrite=True``. A save is written next to its directory (``.<name>.tmp``) and swapped in
once complete, so a crash in the middle of a save never costs the checkpoint it replaces.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rl_train.tinker.futures import UserError
from rl_train.tinker.state import BaseModel, LoraSpec, Snapshot, TrainingClient
from rl_train.tinker.tensorfile import load_tensors, save_tensors

__all__ = ["load_snapshot", "load_state", "parse_path", "read_meta", "save"]

KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"^[A-Za-z0-9._:-]+$")


def parse_path(path: str) -> tuple[str, str, str]:
    """``tinker://<model_id>/<kind>/<name>`` -> ``(model_id, kind, name)``; :class:`UserError`."""
    match = re.fullmatch(r"tinker://([^/]+)/([^/]+)/([^/]+)", path)
    if not match or match[2] not in KINDS or not all(_NAME.match(p) for p in match.groups()):
        raise UserError(
            f"checkpoint path {path!r} is not tinker://<model_id>/<weights|sampler_weights>/<name> "
            "(names of letters, digits, '.', '_', ':' and '-')"
        )
    if ".." in (match[1], match[3]):
        raise UserError(f"checkpoint path {path!r} may not contain '..'")
    return match[1], match[2], match[3]


def directory(root: Path, path: str) -> Path:
    """The directory of checkpoint ``path`` under ``root`` (a swap a crash cut short undone)."""
    model_id, kind, name = parse_path(path)
    target = root / model_id / kind / name
    old = _aside(target, "old")
    if not target.exists() and (old / "checkpoint.json").is_file():
        old.rename(target)  # killed between the two renames of _swap_in: the previous one
    return target


def _aside(target: Path, what: str) -> Path:
    """``.<name>.<what>`` next to ``target``: where a save is written, or the old one set aside."""
    return target.parent / f".{target.name}.{what}"


def _swap_in(written: Path, target: Path) -> None:
    """Replace ``target`` by the complete ``written`` directory.

    The old checkpoint is set aside, the new one renamed in, the old one deleted: a crash
    before the first rename keeps the old checkpoint as it was, one between the renames is
    undone by :func:`directory` at the next read.
    """
    old = _aside(target, "old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    written.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def save(
    root: Path,
    base: BaseModel,
    client: TrainingClient,
    kind: str,
    name: str,
    base_model: str,
    *,
    overwrite: bool = True,
    ttl_seconds: int | None = None,
    user_metadata: Mapping[str, str] | None = None,
) -> str:
    """Write ``client``'s adapter (and, for ``weights``, its AdamW state); return the path.

    Args:
        root: The server's checkpoint directory.
        base: The served model.
        client: The training client whose weights are saved.
        kind: ``weights`` (``save_state``) or ``sampler_weights``.
        name: The checkpoint's name (the path's last part).
        base_model: The served model's name, recorded for the loads' check.
        overwrite: Replace an existing checkpoint of that name (else :class:`UserError`).
        ttl_seconds: Seconds after which loads refuse the checkpoint (None: never).
        user_metadata: Strings recorded in ``checkpoint.json``.

    Returns:
        The checkpoint's ``tinker://`` path.

    Raises:
        UserError: A bad name or ``ttl_seconds``, or an existing checkpoint without
            ``overwrite``.
    """
    path = f"tinker://{client.model_id}/{kind}/{name}"
    target = directory(root, path)
    if not overwrite and (target / "checkpoint.json").exists():
        raise UserError(
            f"checkpoint {path!r} exists already: pass `overwrite=True` to save_state to "
            "replace it, or another `name`"
        )
    if ttl_seconds is not None and not (isinstance(ttl_seconds, int) and ttl_seconds >= 1):
        raise UserError(
            f"`ttl_seconds` must be an integer >= 1 (seconds), got {ttl_seconds!r}; "
            "pass None for a checkpoint that never expires"
        )
    final, target = target, _aside(target, "tmp")  # written aside, swapped in once complete
    shutil.rmtree(target, ignore_errors=True)  # a save a crash cut short
    target.mkdir(parents=True)
    params = base.adapter_params(client.adapter)
    names = list(params)
    save_tensors(
        {k: v.detach().contiguous() for k, v in params.items()}, target / "adapter.safetensors"
    )
    meta: dict[str, Any] = {
        "format": "rl-train tinker checkpoint 1",
        "base_model": base_model,
        "lora": asdict(client.lora),
        "steps": client.steps,
        "tensor_order": names,
        "optimizer": None,
        "expires_at": None if ttl_seconds is None else time.time() + ttl_seconds,
        "user_metadata": dict(user_metadata or {}),
    }
    if kind == "weights" and client.optimizer is not None:
        state = client.optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        for index, slots in state["state"].items():
            for slot, value in slots.items():
                tensors[f"{index}.{slot}"] = torch.as_tensor(value).detach().contiguous()
        save_tensors(tensors, target / "optimizer.safetensors")
        groups = [dict(g.items()) for g in state["param_groups"]]
        meta["optimizer"] = {"param_groups": groups}
    (target / "checkpoint.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    _swap_in(target, final)
    return path


def _unreadable(path: str, file: Path, exc: Exception) -> UserError:
    return UserError(
        f"checkpoint {path!r} is unreadable ({file}: {type(exc).__name__}: {exc}); save it "
        "again or load another checkpoint"
    )


def read_meta(root: Path, path: str, served: Sequence[str] = ()) -> dict[str, Any]:
    """A checkpoint's JSON, checked.

    Args:
        root: The server's checkpoint directory.
        path: The checkpoint's ``tinker://`` path.
        served: The names of the served base model; when given, a checkpoint of another base
            model is refused.

    Returns:
        The parsed ``checkpoint.json``.

    Raises:
        UserError: No checkpoint at ``path``, an unreadable or expired one, or one of another
            base model.
    """
    meta_file = directory(root, path) / "checkpoint.json"
    if not meta_file.is_file():
        raise UserError(f"no checkpoint at {path!r} on this server (looked in {meta_file.parent})")
    try:
        meta: dict[str, Any] = json.loads(meta_file.read_text())
        lora_of(meta)
        base_model, expires_at = meta["base_model"], meta.get("expires_at")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _unreadable(path, meta_file, exc) from None
    if expires_at is not None and time.time() > float(expires_at):
        raise UserError(
            f"checkpoint {path!r} expired (its `ttl_seconds` ran out); save it again with a "
            "longer ttl_seconds, or None"
        )
    if served and base_model not in served:
        raise UserError(
            f"checkpoint {path!r} is a LoRA of base model {base_model!r}; this server serves "
            f"{served[0]!r}: load it on a server of {base_model!r} (or, if it is the same model, "
            f"start this one with --model-name {base_model})"
        )
    return meta


def lora_of(meta: dict[str, Any]) -> LoraSpec:
    """The LoRA shape recorded in a checkpoint's JSON."""
    lora = meta["lora"]
    return LoraSpec(int(lora["rank"]), tuple(lora["targets"]), int(lora["seed"]))


def _tensors(root: Path, path: str, file: str) -> dict[str, torch.Tensor]:
    target = directory(root, path) / file
    try:
        return load_tensors(target)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, struct.error) as exc:
        raise _unreadable(path, target, exc) from None


def load_snapshot(root: Path, path: str, served: Sequence[str] = ()) -> Snapshot:
    """A checkpoint's adapter tensors, for sampling (``served``: as for :func:`read_meta`)."""
    meta = read_meta(root, path, served)
    return Snapshot(lora_of(meta), _tensors(root, path, "adapter.safetensors"))


def load_state(
    root: Path,
    base: BaseModel,
    client: TrainingClient,
    path: str,
    *,
    optimizer: bool,
    served: Sequence[str] = (),
) -> None:
    """Load checkpoint ``path`` into ``client`` (its AdamW state too with ``optimizer``).

    ``served``: as for :func:`read_meta`. The gradients ``client`` accumulated are dropped.
    """
    meta = read_meta(root, path, served)
    if lora_of(meta).key() != client.lora.key():
        raise UserError(
            f"checkpoint {path!r} is a LoRA of rank {meta['lora']['rank']} on "
            f"{meta['lora']['targets']}; this training client is rank {client.lora.rank} on "
            f"{list(client.lora.targets)}: create the client with the checkpoint's rank"
        )
    base.load_snapshot(client.adapter, load_snapshot(root, path, served))
    for param in base.adapter_params(client.adapter).values():
        param.grad = None  # gradients of the replaced weights must not reach the next step
    client.steps = int(meta["steps"])
    client.optimizer = None
    if not optimizer:
        return
    if meta["optimizer"] is None:
        if path.split("/")[-2] == "sampler_weights":
            raise UserError(f"{path!r} holds sampler weights only, no optimizer state")
        return  # saved before the first optim_step: a fresh AdamW is the saved state
    params = base.adapter_params(client.adapter)
    ordered = [params[name] for name in meta["tensor_order"]]
    client.optimizer = torch.optim.AdamW(ordered)
    tensors = _tensors(root, path, "optimizer.safetensors")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, slot = key.split(".", 1)
        state.setdefault(int(index), {})[slot] = value
    groups = meta["optimizer"]["param_groups"]
    for group in groups:
        group["betas"] = tuple(group["betas"])
    client.optimizer.load_state_dict({"state": state, "param_groups": groups})
