"""Tiny real models, LoRA configs, parameter snapshots and checkpoint helpers shared by the
rl-adapters tests.

Everything is built locally from a seed with :mod:`rl_testing.models` (nothing is downloaded,
nothing is mocked): two models built with the same ``arch`` and ``seed`` have identical weights,
so a fresh model is the reference for "the base" and for "a fresh PolicyModel" after a load.

Parameters are identified through ``policy.base_model.named_parameters()`` (PEFT names:
``...q_proj.lora_A.<adapter>.weight`` for LoRA, everything without ``lora_`` is the base) and
through the spec's ``trainable_parameters(role)``; the actor adapter's name is not part of the spec,
so actor/critic LoRA parameters are taken from ``trainable_parameters`` rather than by name.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from rl_testing.models import TINY_DEFAULTS, tiny_causal_lm
from transformers import PreTrainedModel

ARCHS = ("qwen2", "llama")
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
# Bit for bit: only where the same kernels run on the same inputs (each use says why).
EXACT: dict[str, float] = {"rtol": 0.0, "atol": 0.0}
# rl_testing.tolerance keywords for two routes to the same float32 values of a tiny model:
# HEAD: the lm head alone (`lm_head(h)` vs `h @ W.T`), one sum over the hidden size;
# FORWARD: a whole forward (two routes through the decoder: PEFT vs merged weights, packed vs
# padded, a role's adapter vs a fresh model), the longest sum being the MLP's down projection,
# one stage per decoder layer and one for the head.
HEAD: dict[str, int] = {"reduction": TINY_DEFAULTS["hidden_size"], "stages": 1}
FORWARD: dict[str, int] = {
    "reduction": max(TINY_DEFAULTS["hidden_size"], TINY_DEFAULTS["intermediate_size"]),
    "stages": TINY_DEFAULTS["num_hidden_layers"] + 1,
}
# GRADS: gradients of a loss on a tiny forward, two routes (checkpointing or not, lean or
# plain): the forward's stages and as many again for the backward.
GRADS: dict[str, int] = {**FORWARD, "stages": 2 * FORWARD["stages"]}


# --------------------------------------------------------------------------- models and inputs


def base(arch: str = "qwen2", seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A tiny random-weight causal LM; same ``arch``/``seed``/overrides -> same weights."""
    model, _ = tiny_causal_lm(arch, seed=seed, **overrides)  # type: ignore[call-overload]
    return model


def vocab_size(model: PreTrainedModel) -> int:
    return int(model.config.vocab_size)


def lora(r: int = 4, alpha: int = 8, targets: Iterable[str] = LINEAR_NAMES) -> LoraConfig:
    """A fresh LoraConfig (PEFT may mutate the config it is given, so never share one)."""
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets))


def batch(vocab: int, seed: int = 0, n: int = 3, t: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids ``[n, t]`` and a right-padded attention mask (row 1 has 2 pad positions)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (n, t), generator=gen)
    mask = torch.ones(n, t, dtype=torch.long)
    if n > 1:
        mask[1, -2:] = 0
        ids[1, -2:] = 0
    return ids, mask


@torch.no_grad()
def forward_logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain ``model(input_ids, attention_mask).logits`` without gradients."""
    return model(input_ids=ids, attention_mask=mask).logits.detach().clone()


def base_logits(
    arch: str, ids: torch.Tensor, mask: torch.Tensor, seed: int = 0, **overrides: Any
) -> torch.Tensor:
    """Logits of a fresh, never-wrapped base model (identical weights to ``base(arch, seed)``)."""
    return forward_logits(base(arch, seed, **overrides), ids, mask)


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked next-token cross-entropy (a loss that touches every logit row)."""
    logp = logits[:, :-1].log_softmax(-1)
    tgt = ids[:, 1:]
    m = mask[:, 1:].to(logp.dtype)
    nll = -logp.gather(-1, tgt[..., None])[..., 0]
    return (nll * m).sum() / m.sum()


# --------------------------------------------------------------------------- parameters


def named(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return dict(module.named_parameters(remove_duplicate=False))


def names_of(module: torch.nn.Module, params: Iterable[torch.Tensor]) -> list[str]:
    """Names (in ``module``) of ``params``; fails on a parameter that ``module`` does not own."""
    by_id = {id(p): n for n, p in module.named_parameters()}
    out = []
    for p in params:
        assert id(p) in by_id, "parameter not found in the module"
        out.append(by_id[id(p)])
    return out


def base_params(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Non-LoRA parameters (the base model's own weights)."""
    return {n: p for n, p in named(module).items() if "lora_" not in n}


def adapter_params(module: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    """LoRA parameters of the adapter called ``adapter`` (PEFT naming)."""
    out = {n: p for n, p in named(module).items() if "lora_" in n and f".{adapter}." in n}
    assert out, f"no LoRA parameters for adapter {adapter!r}"
    return out


def lora_module(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.lora_A.actor.weight`` -> ``...q_proj.lora_A``."""
    m = re.match(r"^(.*\.lora_[AB])\.[^.]+\.weight$", name)
    assert m is not None, name
    return m.group(1)


def by_lora_module(module: torch.nn.Module, params: Iterable[torch.Tensor]) -> dict[str, Any]:
    """Maps each LoRA parameter to its adapter-independent position (for actor vs reference)."""
    return {lora_module(n): p for n, p in zip(names_of(module, params), params, strict=True)}


def snapshot(
    params: Mapping[str, torch.Tensor] | Iterable[torch.Tensor],
) -> dict[Any, torch.Tensor]:
    """Detached clones, keyed by name (mapping) or by position (iterable)."""
    items = params.items() if isinstance(params, Mapping) else enumerate(params)
    return {k: v.detach().clone() for k, v in items}


def changed(before: Mapping[Any, torch.Tensor], params: Mapping[Any, torch.Tensor]) -> set[Any]:
    """Keys whose current value is not bit-identical to the snapshot."""
    # bit-exact: a parameter not written to keeps its snapshot's bits
    return {k for k, v in before.items() if not torch.equal(v, params[k].detach())}


@torch.no_grad()
def perturb(params: Iterable[torch.Tensor], seed: int, scale: float = 0.05) -> None:
    """Adds seeded noise in place (makes LoRA adapters non-trivial: B = 0 at init)."""
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)  # drawn on CPU: any device
        p.add_(scale * noise.to(p.device))


def grad_flags(module: torch.nn.Module, *extra: torch.nn.Module | None) -> dict[str, bool]:
    """``requires_grad`` of every parameter of ``module`` (and of the ``extra`` modules)."""
    flags = {n: p.requires_grad for n, p in named(module).items()}
    for i, mod in enumerate(extra):
        if mod is not None:
            flags.update({f"extra{i}.{n}": p.requires_grad for n, p in named(mod).items()})
    return flags


def ids(params: Iterable[torch.Tensor]) -> set[int]:
    return {id(p) for p in params}


# --------------------------------------------------------------------------- memory


def reachable_tensors(root: object, max_depth: int = 10) -> list[torch.Tensor]:
    """Every tensor reachable from ``root`` through modules, attributes and containers.

    Used to measure what an object really holds (parameters, buffers, and any plain tensor or
    hidden deep copy kept on an attribute), without knowing how it is implemented.
    """
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    stack: list[tuple[object, int]] = [(root, 0)]
    skip = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, str, bytes)
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        children: list[object]
        if isinstance(obj, torch.Tensor):
            out.append(obj)
            continue
        if isinstance(obj, torch.nn.Module):
            out.extend(obj.parameters())
            out.extend(obj.buffers())
            children = [*obj.children(), *vars(obj).values()]
        elif isinstance(obj, Mapping):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        elif hasattr(obj, "__dict__"):
            children = list(vars(obj).values())
        else:
            continue
        if depth < max_depth:
            stack.extend((c, depth + 1) for c in children)
    return out


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared storages counted once)."""
    storages: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


# --------------------------------------------------------------------------- checkpoints


def file_tree(directory: Path) -> dict[str, bytes]:
    """Relative posix path -> bytes of every file under ``directory``."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_scalars(obj: object) -> tuple[set[str], set[int]]:
    """All strings (keys and values) and all ints found anywhere in a JSON document."""
    strings: set[str] = set()
    ints: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            strings.update(str(k) for k in o)
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
        elif isinstance(o, str):
            strings.add(o)
        elif isinstance(o, bool):
            continue
        elif isinstance(o, int):
            ints.add(o)
    return strings, ints


def _rewrite(
    entry: Any, old: str, new: str, old_sha: str, new_sha: str, old_size: int, size: int
) -> Any:
    if isinstance(entry, dict):
        return {
            k: _rewrite(v, old, new, old_sha, new_sha, old_size, size) for k, v in entry.items()
        }
    if isinstance(entry, list):
        return [_rewrite(v, old, new, old_sha, new_sha, old_size, size) for v in entry]
    if isinstance(entry, str):
        return new if entry == old else (new_sha if entry == old_sha else entry)
    if isinstance(entry, int) and not isinstance(entry, bool) and entry == old_size:
        return size
    return entry


def add_to_manifest(directory: Path, template: str, rel: str) -> None:
    """Lists the existing file ``directory/rel`` in ``manifest.json`` with its true size and
    sha256, by copying the entry of the already-listed file ``template`` (works whether the
    manifest keys files by path or keeps a list of per-file records)."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    old_data = (directory / template).read_bytes()
    new_data = (directory / rel).read_bytes()
    args = (template, rel, sha256(old_data), sha256(new_data), len(old_data), len(new_data))

    def visit(node: Any) -> bool:
        if isinstance(node, dict):
            if template in node:
                node[rel] = _rewrite(node[template], *args)
                return True
            return any(visit(v) for v in node.values())
        if isinstance(node, list):
            for item in node:
                if isinstance(item, dict) and template in item.values():
                    node.append(_rewrite(item, *args))
                    return True
            return any(visit(v) for v in node)
        return False

    assert visit(manifest), f"no entry for {template!r} found in manifest.json"
    manifest_path.write_text(json.dumps(manifest))


def set_manifest_entry(directory: Path, rel: str) -> None:
    """Updates the size/sha256 recorded for ``rel`` to match the file's current content."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = (directory / rel).read_bytes()

    def find_entry(node: Any) -> dict[str, Any] | None:
        if isinstance(node, dict):
            if isinstance(node.get(rel), dict):
                return node[rel]
            if rel in node.values():
                return node
            children = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            return None
        for child in children:
            found = find_entry(child)
            if found is not None:
                return found
        return None

    entry = find_entry(manifest)
    assert entry is not None, f"no entry for {rel!r} found in manifest.json"
    for key, value in entry.items():
        if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
            entry[key] = sha256(data)
        elif isinstance(value, int) and not isinstance(value, bool):
            entry[key] = len(data)
    manifest_path.write_text(json.dumps(manifest))


class Payload:
    """A pickle payload: unpickling it calls ``open(marker, "w")``, creating the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def flip_tail(path: Path, n: int = 4) -> None:
    """Flips the last ``n`` bytes of a file (tensor data in a safetensors file: still parses)."""
    data = bytearray(path.read_bytes())
    for i in range(1, n + 1):
        data[-i] ^= 0xFF
    path.write_bytes(bytes(data))


def assert_state_dicts_equal(a: Any, b: Any, where: str = "") -> None:
    """Recursive equality with tensors compared bit-exactly (dtype and shape included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{where}: {type(a)} vs tensor"
        assert isinstance(b, torch.Tensor), f"{where}: tensor vs {type(b)}"
        assert a.dtype == b.dtype, f"{where}: {a.dtype} vs {b.dtype}"
        assert torch.equal(a, b), f"{where}: tensors differ"  # bit-exact: saved and loaded states
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{where}: {type(b)}"
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            assert_state_dicts_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)), f"{where}: {type(b)}"
        assert len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_state_dicts_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_scoped_swap(swap: Any, model: torch.nn.Module, class_name: str, marker: str) -> None:
    """A lean-module swap (``swap(model, enabled)``: ``lean_rms_norm``, ``lean_swiglu``) sets
    its forward on every ``class_name`` module only inside the block, owns it once when
    nested, restores it after an error, and leaves a forward someone else set alone."""
    import pytest

    modules = [m for m in model.modules() if type(m).__name__ == class_name]
    assert modules
    with swap(model) as outer:
        assert outer == len(modules)
        assert all(hasattr(m.__dict__.get("forward"), marker) for m in modules)
        forwards = [m.forward for m in modules]
        with swap(model) as inner:
            assert inner == 0  # the enclosing block owns the swap
        assert [m.forward for m in modules] == forwards
    assert not any("forward" in m.__dict__ for m in modules)
    with swap(model, enabled=False) as none:
        assert none == 0
    with pytest.raises(RuntimeError, match="boom"), swap(model):
        raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in modules)
    hooked = modules[0]
    hooked.forward = lambda x: type(hooked).forward(hooked, x)  # type: ignore[method-assign]
    with swap(model) as n:
        assert n == len(modules) - 1 and not hasattr(hooked.forward, marker)
    assert "forward" in hooked.__dict__  # a hook library's forward is left in place


def backward_kinds(loss: torch.Tensor, monkeypatch: Any) -> set[str]:
    """``loss.backward()``, and the class names of every autograd node it runs through.

    A reentrant checkpoint (``rl_adapters.replay.replayed_checkpoint``) hides its layer behind
    one ``CheckpointFunctionBackward`` node and rebuilds the layer's graph during the backward,
    where it calls ``torch.autograd.backward`` on it: that call is observed too, so the nodes of
    every recomputation are in the set.
    """
    kinds = graph_kinds(loss)
    original = torch.autograd.backward

    def observed(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        for t in tensors if isinstance(tensors, tuple | list) else (tensors,):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                kinds.update(graph_kinds(t))
        return original(tensors, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.autograd, "backward", observed)
        loss.backward()
    return kinds


def graph_kinds(t: torch.Tensor) -> set[str]:
    """The class names of every autograd node behind ``t``."""
    seen, todo, kinds = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kinds.add(type(node).__name__)
        todo += [nxt for nxt, _ in node.next_functions]
    return kinds


def lean_swap_arms(
    arch: str, checkpointing: bool, swap_name: str, monkeypatch: Any
) -> list[tuple[torch.Tensor, list[torch.Tensor], set[str]]]:
    """A LoRA policy's forward and backward inside ``lean_lora()``, without and with one swap.

    ``swap_name`` is the ``rl_adapters.policy`` global to switch off in the first arm
    (``"lean_rms_norm"``, ``"lean_swiglu"``); every other lean part runs in both. Each arm
    gives the logits, the actor's gradients and the autograd node names behind the loss.
    """
    import rl_adapters.policy as policy_module
    from rl_adapters import PolicyModel

    swap = getattr(policy_module, swap_name)
    arms = []
    for lean in (False, True):
        if not lean:
            monkeypatch.setattr(policy_module, swap_name, lambda m, enabled=True: swap(m, False))
        model = base(arch)
        policy = PolicyModel(model, lora_config=lora(), gradient_checkpointing=checkpointing)
        params = policy.trainable_parameters("actor")
        perturb(params, seed=1)
        ids, mask = batch(vocab_size(model))
        with policy.lean_lora():
            logits = policy.logits(ids, mask)
            loss = lm_loss(logits, ids, mask)
            kinds = backward_kinds(loss, monkeypatch)
        assert not any("forward" in m.__dict__ for m in policy.causal_lm.modules())
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)
        arms.append((logits.detach(), grads, kinds))
        monkeypatch.undo()
    return arms  # type: ignore[return-value]
