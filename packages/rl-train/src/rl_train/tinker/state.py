"""The model behind the service: one base, a LoRA adapter and an optimizer per training client.

Every training client (``create_lora_training_client(base_model, rank)``) is one named peft
adapter on the one shared base, the same construction as
:class:`rl_adapters.SharedBasePopulation` (rl-train reaches rl-adapters only through rl-algos,
so the named adapters are made here with peft, which rl-train declares): the base weights exist
once, each client trains only its own ``lora_A``/``lora_B`` tensors with its own AdamW, so a
client's ``forward_backward``/``optim_step`` never touches another's adapter. Sampling uses a
weight snapshot (a copy of the adapter's tensors) loaded into a per-shape sampler adapter, so a
sampling client sees fixed weights whatever its training client does next.

All methods run on the :class:`~rl_train.tinker.futures.FutureQueue` worker, one at a time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rl_train.tinker.futures import UserError
from rl_train.tinker.losses import check_loss_inputs, compute_loss
from rl_train.tinker.wire import FwdBwdRequest, encode_forward_backward_output

__all__ = ["BaseModel", "Snapshot", "TrainingClient"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn", "c_proj", "out_proj")
_MLP = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "c_fc", "w1", "w2", "w3")


@dataclass(frozen=True)
class LoraSpec:
    """The adapter shape of a training client (Tinker's ``LoraConfig`` fields we honour)."""

    rank: int
    targets: tuple[str, ...]
    seed: int

    def key(self) -> str:
        """A name part identifying the shape (rank and targets) for the sampler adapters."""
        return f"r{self.rank}_" + "_".join(self.targets)


@dataclass(frozen=True)
class Snapshot:
    """Fixed adapter weights (None: the base model), with the shape they fit."""

    lora: LoraSpec | None
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """``<module path>.lora_A.weight`` / ``.lora_B.weight`` -> tensor (adapter name removed)."""


@dataclass
class TrainingClient:
    """One training client: its adapter name, shape and optimizer (made at the first step)."""

    model_id: str
    adapter: str
    lora: LoraSpec
    optimizer: torch.optim.AdamW | None = None
    steps: int = 0


#: ``AdamParams`` fields: the SDK's default, the accepted range (a check and its wording).
ADAM_FIELDS: Mapping[str, tuple[float, Callable[[float], bool], str]] = {
    "learning_rate": (1e-4, lambda v: v >= 0, ">= 0"),
    "beta1": (0.9, lambda v: 0 <= v < 1, "in [0, 1)"),
    "beta2": (0.95, lambda v: 0 <= v < 1, "in [0, 1)"),
    "eps": (1e-12, lambda v: v > 0, "> 0"),
    "weight_decay": (0.0, lambda v: v >= 0, ">= 0"),
    "grad_clip_norm": (0.0, lambda v: v >= 0, ">= 0 (0: no clipping)"),
}


def adam_params(params: Mapping[str, Any]) -> dict[str, float]:
    """``AdamParams`` as floats, defaults filled in; :class:`UserError` naming a bad field.

    NaN and infinities arrive as JSON ``null`` (the SDK's encoding), so ``None`` is refused
    like any other value that is not a finite number.
    """
    unknown = sorted(set(params) - set(ADAM_FIELDS))
    if unknown:
        raise UserError(
            f"`adam_params` has unknown fields {unknown}; AdamParams has {list(ADAM_FIELDS)}"
        )
    out: dict[str, float] = {}
    for key, (default, ok, wording) in ADAM_FIELDS.items():
        value = params.get(key, default)
        number = (
            float(value)
            if isinstance(value, int | float) and not isinstance(value, bool)
            else math.nan
        )
        if not (math.isfinite(number) and ok(number)):
            shown = "NaN or infinite" if value is None else repr(value)
            raise UserError(
                f"`adam_params.{key}` must be a finite number {wording}, got {shown}; "
                f"pass e.g. {default} (the AdamParams default)"
            )
        out[key] = number
    return out


class BaseModel:
    """The base causal LM (float32), its peft wrapper once a client exists, and the clients."""

    def __init__(self, path: str, *, max_context_length: int | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.path = path
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        )
        self.model.train(False)  # no dropout: a forward is a function of the weights
        config = self.model.config
        limit = getattr(config, "max_position_embeddings", None)
        self.max_context_length = int(max_context_length or limit or 2048)
        self.eos_token_id = getattr(self.model.generation_config, "eos_token_id", None)
        head = self.model.get_output_embeddings()
        self._linear_names = {  # read before peft wraps the layers
            name.rsplit(".", 1)[-1]
            for name, module in self.model.named_modules()
            if isinstance(module, nn.Linear) and module is not head
        }
        self._head_is_linear = isinstance(head, nn.Linear)
        self.peft: Any = None
        self.clients: dict[str, TrainingClient] = {}
        self._sampler_adapters: dict[str, str] = {}

    # ----------------------------------------------------------------------- adapters
    def _targets(self, train_attn: bool, train_mlp: bool, train_unembed: bool) -> tuple[str, ...]:
        names = self._linear_names
        chosen = {n for n in names if (n in _ATTN and train_attn) or (n in _MLP and train_mlp)}
        chosen |= {n for n in names if n not in _ATTN and n not in _MLP and train_attn}
        if train_unembed and self._head_is_linear:
            chosen.add("lm_head")
        if not chosen:
            raise UserError(
                "lora_config trains nothing: set train_attn, train_mlp or train_unembed"
            )
        return tuple(sorted(chosen))

    def _add_adapter(self, name: str, lora: LoraSpec) -> None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora.rank, lora_alpha=32, lora_dropout=0.0, target_modules=list(lora.targets)
        )
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(lora.seed)  # the adapter's init is a function of its seed
        try:
            if self.peft is None:
                self.peft = get_peft_model(self.model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        finally:
            torch.random.set_rng_state(generator_state)
        for pname, param in self.peft.named_parameters():
            param.requires_grad_(False if ".lora_" not in pname else param.requires_grad)

    def create_client(
        self,
        model_id: str,
        rank: int,
        *,
        seed: int | None,
        train_attn: bool = True,
        train_mlp: bool = True,
        train_unembed: bool = True,
        targets: tuple[str, ...] | None = None,
    ) -> TrainingClient:
        """A new LoRA training client ``model_id`` of rank ``rank`` (on ``targets`` if given)."""
        if rank < 1:
            raise UserError(f"lora_config.rank must be >= 1, got {rank}")
        if targets is None:
            targets = self._targets(train_attn, train_mlp, train_unembed)
        elif not set(targets) <= self._linear_names | {"lm_head"}:
            raise UserError(f"LoRA targets {targets} are not linear layers of this model")
        lora = LoraSpec(rank, targets, 0 if seed is None else int(seed))
        adapter = "client_" + re.sub(r"[^A-Za-z0-9]", "_", model_id)
        self._add_adapter(adapter, lora)
        client = TrainingClient(model_id, adapter, lora)
        self.clients[model_id] = client
        return client

    def client(self, model_id: str) -> TrainingClient:
        """The training client ``model_id``; :class:`UserError` if there is none."""
        found = self.clients.get(model_id)
        if found is None:
            raise UserError(
                f"unknown model_id {model_id!r}: no training client of that id on this server "
                f"(known: {sorted(self.clients)})"
            )
        return found

    def adapter_params(self, adapter: str) -> dict[str, nn.Parameter]:
        """Adapter ``adapter``'s tensors by name with the adapter name removed."""
        marker = f".{adapter}."
        return {
            name.replace(marker, "."): param
            for name, param in self.peft.named_parameters()
            if ".lora_" in name and marker in name
        }

    @contextmanager
    def active(self, adapter: str | None) -> Iterator[Any]:
        """Run the body with adapter ``adapter`` (None: the base model); yields the model."""
        if adapter is None:
            if self.peft is None:
                yield self.model
            else:
                with self.peft.disable_adapter():
                    yield self.peft
            return
        self.peft.set_adapter(adapter)
        for name, param in self.peft.named_parameters():
            param.requires_grad_(f".{adapter}." in name and ".lora_" in name)
        yield self.peft

    # ----------------------------------------------------------------------- forward
    def target_logprobs(
        self, model: Any, tokens: list[torch.Tensor], targets: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, N] log-probs of ``targets`` after each position of ``tokens``, and [B, N] valid."""
        width = max(len(t) for t in tokens)
        ids = torch.zeros(len(tokens), width, dtype=torch.long)
        tgt = torch.zeros(len(tokens), width, dtype=torch.long)
        valid = torch.zeros(len(tokens), width, dtype=torch.bool)
        for i, (t, y) in enumerate(zip(tokens, targets, strict=True)):
            ids[i, : len(t)] = t
            tgt[i, : len(t)] = y.to(torch.long)
            valid[i, : len(t)] = True
        logits = model(input_ids=ids, attention_mask=valid.long()).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tgt[..., None])[..., 0]
        return logprobs, valid

    def forward_backward(self, request: FwdBwdRequest) -> bytes:
        """Tinker's ``forward_backward`` (or ``forward``): the loss, its gradient, the log-probs."""
        client = self.client(request.model_id)
        vocab = int(self.model.config.vocab_size)
        for i, datum in enumerate(request.data):
            check_loss_inputs(
                request.loss_fn, i, len(datum.tokens), datum.inputs, request.forward_only
            )
            self.check_tokens(datum.tokens, f"data[{i}].model_input", vocab)
            self.check_tokens(datum.inputs["target_tokens"], f"data[{i}].target_tokens", vocab)
        if not request.data:
            raise UserError("forward_backward needs at least one Datum")
        tokens = [d.tokens for d in request.data]
        targets = [d.inputs["target_tokens"] for d in request.data]
        with self.active(client.adapter) as model, torch.set_grad_enabled(not request.forward_only):
            logprobs, valid = self.target_logprobs(model, tokens, targets)
            loss = compute_loss(
                request.loss_fn,
                request.loss_fn_config,
                logprobs,
                valid,
                [d.inputs for d in request.data],
            )
            if not request.forward_only:
                loss.backward()
        outputs = []
        for i, d in enumerate(request.data):
            lp = logprobs[i, : len(d.tokens)].detach()
            row: dict[str, torch.Tensor] = {"logprobs": lp}
            if request.loss_fn == "cross_entropy":
                w = d.inputs.get("weights", torch.ones_like(lp))
                row["elementwise_loss"] = -lp * w.to(lp.dtype)
            outputs.append(row)
        return encode_forward_backward_output(outputs, {"loss:sum": float(loss.detach())})

    def check_tokens(self, tokens: torch.Tensor, where: str, vocab: int) -> None:
        """Token ids in ``[0, vocab)`` and a length within the context; :class:`UserError`."""
        if len(tokens) > self.max_context_length:
            raise UserError(
                f"{where} has {len(tokens)} tokens, over the context length "
                f"{self.max_context_length} of this server's model"
            )
        if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise UserError(f"{where} holds token ids outside the vocabulary [0, {vocab})")

    # ----------------------------------------------------------------------- optimizer
    def optim_step(self, model_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One AdamW step (decoupled weight decay) of ``model_id``'s adapter; grads zeroed."""
        client = self.client(model_id)
        tensors = list(self.adapter_params(client.adapter).values())
        adam = adam_params(params)
        lr, eps, decay = adam["learning_rate"], adam["eps"], adam["weight_decay"]
        betas = (adam["beta1"], adam["beta2"])
        if client.optimizer is None:
            client.optimizer = torch.optim.AdamW(
                tensors, lr=lr, betas=betas, eps=eps, weight_decay=decay
            )
        for group in client.optimizer.param_groups:
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=decay)
        metrics: dict[str, float] = {}
        if adam["grad_clip_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(tensors, adam["grad_clip_norm"])
            metrics["grad_norm:mean"] = float(norm)
        client.optimizer.step()
        client.optimizer.zero_grad(set_to_none=True)
        client.steps += 1
        return {"metrics": metrics}

    # ----------------------------------------------------------------------- snapshots
    def snapshot(self, model_id: str) -> Snapshot:
        """A copy of ``model_id``'s adapter tensors."""
        client = self.client(model_id)
        tensors = {k: v.detach().clone() for k, v in self.adapter_params(client.adapter).items()}
        return Snapshot(client.lora, tensors)

    def load_snapshot(self, adapter: str, snapshot: Snapshot) -> None:
        """Copy ``snapshot``'s tensors into adapter ``adapter`` (shapes must agree)."""
        params = self.adapter_params(adapter)
        misfit = set(params) ^ set(snapshot.tensors) or {
            name for name, p in params.items() if p.shape != snapshot.tensors[name].shape
        }
        if misfit:
            raise UserError(
                f"the checkpoint's LoRA tensors do not fit this adapter (rank, targets or the "
                f"base model's layer sizes differ), e.g. {sorted(misfit)[0]!r}"
            )
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(snapshot.tensors[name])

    @contextmanager
    def sampling(self, snapshot: Snapshot) -> Iterator[Any]:
        """Run the body with ``snapshot``'s weights; yields the model."""
        if snapshot.lora is None:
            with self.active(None) as model:
                yield model
            return
        key = snapshot.lora.key()
        adapter = self._sampler_adapters.get(key)
        if adapter is None:
            adapter = f"sampler_{len(self._sampler_adapters)}"
            self._add_adapter(adapter, snapshot.lora)
            self._sampler_adapters[key] = adapter
        self.load_snapshot(adapter, snapshot)
        with self.active(adapter) as model:
            yield model
