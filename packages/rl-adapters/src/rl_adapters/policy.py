"""One causal-LM base with LoRA adapters by role: actor, reference and critic.

Roles share the frozen base weights; each role is a LoRA adapter (or, for the reference, the
base with adapters disabled). ``use_role`` switches the active adapter and restores the actor
and the exact trainable set on exit: peft's ``set_adapter`` marks only the active adapter
trainable, which would otherwise freeze the actor after a reference forward. The switch visits
only the LoRA layers, recorded once (:class:`rl_adapters.roles.LoraSites`), not every module;
``merged_for_generation`` runs the actor with its LoRA delta merged into new base weights, so
sampling costs what the bare model's does.

Log-probs are not computed here: :meth:`PolicyModel.hidden_states` returns the last hidden
states and :attr:`PolicyModel.lm_head_weight` the projection, so rl-algos feeds them to
``rl_kernels.fused_logprobs`` / ``fused_policy_loss`` without materialising logits.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from rl_adapters._compat import require_torch_integration
from rl_adapters.lean_mlp import lean_swiglu
from rl_adapters.lean_norm import lean_rms_norm
from rl_adapters.lean_report import LeanForwards, LeanReport, check_lean_forwards
from rl_adapters.lean_rotary import lean_rotary
from rl_adapters.lean_survey import survey
from rl_adapters.lora import (
    default_lora_config,
    match_dropout_mode,
    scope_lora_config,
    validate_lora_config,
)
from rl_adapters.replay import (
    Switch,
    drop_input_require_grads,
    enable_checkpointing,
    replayable,
)
from rl_adapters.roles import LoraSites
from rl_adapters.seeding import seeded
from rl_adapters.value_head import ValueHead

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

__all__ = ["PolicyModel", "ReferenceMode", "causal_lm_of", "copy_adapter", "is_lora_param_of"]

ReferenceMode = Literal["adapter", "base", "copy"] | None


def is_lora_param_of(name: str, adapter: str) -> bool:
    """Whether a parameter name belongs to LoRA adapter ``adapter``."""
    return f".{adapter}." in name and ".lora_" in name


def copy_adapter(peft_model: PeftModel, source: str, target: str) -> None:
    """Copy adapter ``source``'s weights onto adapter ``target`` exactly."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model, adapter_name=source)
    set_peft_model_state_dict(peft_model, state, adapter_name=target)


def causal_lm_of(peft_model: PeftModel) -> PreTrainedModel:
    """The transformers model inside a peft wrapper (with LoRA layers injected)."""
    inner = peft_model.base_model.model
    if not isinstance(inner, PreTrainedModel):  # pragma: no cover - peft contract
        raise TypeError(f"unexpected peft inner model {type(inner).__name__}")
    return inner


def decoder_of(model: PreTrainedModel) -> nn.Module:
    """The transformer body of a causal LM (everything but the lm_head)."""
    body = getattr(model, model.base_model_prefix, None)
    if not isinstance(body, nn.Module):
        raise ValueError(
            f"cannot find the decoder of {type(model).__name__} (base_model_prefix="
            f"{model.base_model_prefix!r})"
        )
    return body


class PolicyModel(nn.Module):
    """A causal LM with actor / reference / critic roles.

    Args:
        model: A transformers causal LM (``PreTrainedModel``). In LoRA mode it is wrapped in
            place by peft (LoRA layers injected), so pass a model you do not use elsewhere.
        lora_config: ``peft.LoraConfig`` for every adapter; None uses a default (r = 8 on every
            linear layer but lm_head) with a warning. Ignored with ``full_finetune``.
        reference: ``"adapter"`` (a frozen LoRA adapter, initialised equal to the actor and
            refreshed by :meth:`sync_reference`), ``"base"`` (the base with adapters disabled,
            frozen forever), ``"copy"`` (full fine-tuning: a frozen deep copy of the model), or
            None (no reference, e.g. when the KL coefficient is 0).
        critic: Add a ``"critic"`` LoRA adapter and a :class:`ValueHead` (LoRA mode only).
        full_finetune: Train the whole base instead of LoRA adapters.
        gradient_checkpointing: Enable activation checkpointing on the base.
        activation_offload: Keep the activations saved for the backward on the CPU
            (``torch.autograd.graph.save_on_cpu``), trading transfer time for GPU memory.
        lora_target_scope: ``"language"`` puts LoRA only on the language model of a multimodal
            model (no adapters on the vision tower or projector); ``"all"`` keeps the targets
            as given. No effect on text-only models.
        seed: Seed of the adapters' random initialisation (LoRA A and the value head), drawn
            from a private generator state: the caller's global RNG is left untouched and two
            policies built alike start bit-identical.
        lean_forwards: Where the training and scoring forwards run the lean LoRA, rotary,
            RMSNorm and SwiGLU forwards (:meth:`lean_lora`, :meth:`hidden_states`): ``"auto"``
            wherever their checks pass (the rest runs peft's and transformers' own forwards),
            True the same but raise when they pass nowhere on this model, False nowhere.
            :attr:`lean_report` says what they serve.

    Raises:
        ValueError: A bad ``reference``, ``critic`` in full fine-tuning, a ``lean_forwards``
            other than ``"auto"``, True or False, or ``lean_forwards=True`` on a model where
            no lean forward applies (with the reasons).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        lora_config: LoraConfig | None = None,
        reference: ReferenceMode = "adapter",
        critic: bool = False,
        full_finetune: bool = False,
        gradient_checkpointing: bool = False,
        activation_offload: bool = False,
        lora_target_scope: Literal["language", "all"] = "language",
        seed: int = 0,
        lean_forwards: LeanForwards = "auto",
    ) -> None:
        super().__init__()
        require_torch_integration()  # a clear error for a torch that transformers switched off
        self.lean_forwards: LeanForwards = check_lean_forwards(lean_forwards)
        if not isinstance(model, PreTrainedModel):
            raise TypeError(f"`model` must be a transformers PreTrainedModel, got {type(model)}")
        allowed = ("copy", None) if full_finetune else ("adapter", "base", None)
        if reference not in allowed:
            mode = "full fine-tuning" if full_finetune else "LoRA"
            raise ValueError(
                f"`reference` must be one of {allowed} in {mode} mode, got {reference!r}"
            )
        if critic and full_finetune:
            raise ValueError(
                "`critic=True` is not supported in full fine-tuning mode: the critic is a LoRA "
                "adapter on the shared base; use LoRA mode for PPO"
            )
        self.full_finetune = full_finetune
        self.seed = seed
        self.activation_offload = activation_offload
        self.gradient_checkpointing = gradient_checkpointing
        self._checkpointed: list[nn.Module] | None = None
        self.reference_mode: ReferenceMode = reference
        self.has_critic = critic
        self.lora_config: LoraConfig | None = None
        self.reference_model: PreTrainedModel | None = None
        self.value_head: ValueHead | None = None
        self._sites: LoraSites | None = None
        if gradient_checkpointing:
            enable_checkpointing(model)  # recomputations replay the forward's switches
        if full_finetune:
            self.peft: PeftModel | None = None
            self.causal_lm: PreTrainedModel = model
            if reference == "copy":
                self.reference_model = copy.deepcopy(model).requires_grad_(False).eval()
        else:
            config = (
                validate_lora_config(lora_config, model)
                if lora_config is not None
                else default_lora_config(model)
            )
            config = scope_lora_config(config, model, lora_target_scope)
            self.lora_config = config
            self._attach_adapters(model, config)
        if critic:
            with seeded(seed + 1):  # the head is built on the CPU
                self.value_head = ValueHead(self.causal_lm.config.hidden_size)
        self._restore()
        self.lean_report: LeanReport = self._survey()

    def _survey(self) -> LeanReport:
        """:func:`rl_adapters.lean_survey.survey` of this policy's model (logged once)."""
        sites = self.lora_sites() if self.lean_forwards is not False else None
        return survey(self.lean_forwards, self.causal_lm, sites)

    def _attach_adapters(self, model: PreTrainedModel, config: LoraConfig) -> None:
        """Wrap ``model`` with this policy's LoRA adapters, seeded (global RNG untouched)."""
        from peft import PeftModel, get_peft_model  # heavy: only with LoRA

        training = model.training
        with seeded(self.seed, model):  # the adapters are built where the model lives
            peft_model = get_peft_model(model, config, adapter_name="actor")
            if not isinstance(peft_model, PeftModel):  # pragma: no cover - peft contract
                raise TypeError("get_peft_model did not return a PeftModel")
            if self.reference_mode == "adapter":
                peft_model.add_adapter("reference", copy.deepcopy(config))
                copy_adapter(peft_model, "actor", "reference")
            if self.has_critic:
                peft_model.add_adapter("critic", copy.deepcopy(config))
        match_dropout_mode(peft_model, training)  # peft builds LoRA dropout in training mode
        if getattr(model, "_rl_checkpoint", None):  # peft's hook for checkpointing: not needed
            drop_input_require_grads(model)  # (rl_adapters.replay.enable_checkpointing)
        self.lora_config = config
        self.peft = peft_model
        self.causal_lm = causal_lm_of(peft_model)
        self._sites = None  # recorded again on first use

    def rebuild_adapters(self, config: LoraConfig) -> None:
        """Replace every adapter by a fresh one with ``config`` (weights re-initialised).

        Used to grow the rank or the target modules, e.g. by ``load_checkpoint(...,
        merge_lora_config=True)``. Optimizers built over the old parameters must be rebuilt.
        """
        if self.peft is None:
            raise ValueError("full fine-tuning has no adapters to rebuild")
        base = self.peft.unload()
        if not isinstance(base, PreTrainedModel):  # pragma: no cover - peft contract
            raise TypeError("peft unload did not return a PreTrainedModel")
        self._attach_adapters(base, validate_lora_config(config, base))
        self._restore()
        self.lean_report = self._survey()

    @property
    def base_model(self) -> PreTrainedModel:
        """The transformers model (with LoRA layers injected in LoRA mode)."""
        return self.causal_lm

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        model_config: dict[str, Any] | None = None,
        quantization_config: Any | None = None,
        **kwargs: Any,
    ) -> PolicyModel:
        """Load a causal LM by hub name or local path and wrap it.

        Args:
            name_or_path: Passed to ``AutoModelForCausalLM.from_pretrained``.
            model_config: Extra keyword arguments for ``from_pretrained`` (dtype, attention
                implementation, ``local_files_only``, ...).
            quantization_config: A bitsandbytes config for QLoRA (4/8-bit base, LoRA on top).
                CUDA only: elsewhere this raises with an explanation. The lm_head is kept
                unquantized.
            **kwargs: :class:`PolicyModel` arguments.
        """
        from transformers import AutoModelForCausalLM

        options = dict(model_config or {})
        if quantization_config is not None:
            if not torch.cuda.is_available():
                raise ValueError(
                    "`quantization_config` (QLoRA) needs a CUDA device and bitsandbytes; this "
                    "machine has no CUDA device. Load the model unquantized instead"
                )
            if importlib.util.find_spec("bitsandbytes") is None:
                raise ValueError(
                    "`quantization_config` needs bitsandbytes: pip install bitsandbytes"
                )
            skip = getattr(quantization_config, "llm_int8_skip_modules", None)
            if hasattr(quantization_config, "llm_int8_skip_modules") and not skip:
                quantization_config.llm_int8_skip_modules = ["lm_head"]
            options["quantization_config"] = quantization_config
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **options)
        if quantization_config is not None:  # pragma: no cover - CUDA only
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=bool(kwargs.get("gradient_checkpointing"))
            )
        return cls(model, **kwargs)

    # -- roles -----------------------------------------------------------------------------

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this model has, in ``("actor", "reference", "critic")`` order."""
        roles = ["actor"]
        if self.reference_mode is not None:
            roles.append("reference")
        if self.has_critic:
            roles.append("critic")
        return tuple(roles)

    @property
    def adapter_roles(self) -> tuple[str, ...]:
        """Roles stored as LoRA adapters (saved as PEFT adapter directories)."""
        if self.peft is None:
            return ()
        return tuple(r for r in self.roles if r != "reference" or self.reference_mode == "adapter")

    def _restore(self) -> None:
        """Make the actor active and set exactly the trainable parameters."""
        if self.peft is not None:
            self.peft.set_adapter("actor")
            trainable = ("actor", "critic") if self.has_critic else ("actor",)
            for name, param in self.peft.named_parameters():
                param.requires_grad_(any(is_lora_param_of(name, a) for a in trainable))
        else:
            self.causal_lm.requires_grad_(True)
        if self.reference_model is not None:
            self.reference_model.requires_grad_(False)
        if self.value_head is not None:
            self.value_head.requires_grad_(True)

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise ValueError(f"unknown `role` {role!r}; this model has roles {self.roles}")

    def lora_sites(self) -> LoraSites | None:
        """The LoRA layers, recorded on first use; None without LoRA or under ZeRO-3.

        ZeRO-3 partitions the weights and gathers them in per-module hooks, so its role
        switches stay peft's own model-level ones.
        """
        if self.peft is None:
            return None
        if self._sites is None:
            self._sites = LoraSites(self.peft, self.trainable_parameters())
        return None if self._sites.partitioned() else self._sites

    @contextlib.contextmanager
    def use_role(self, role: str) -> Iterator[None]:
        """Run the body with ``role``'s weights; the actor and its trainable set after.

        The switch is :func:`rl_adapters.replay.replayable`: a checkpointed layer that runs
        forward in the body recomputes, during the backward, with ``role`` active again.

        Raises:
            ValueError: For a role this model does not have.
        """
        self._check_role(role)
        switch = self._role_switch(role)
        if switch is None:
            yield
            return
        with replayable(switch):
            yield

    def _role_switch(self, role: str) -> Switch | None:
        """The switch that makes ``role`` active (None: the actor, already active)."""
        if self.peft is None or role == "actor":
            return None
        sites = self.lora_sites()
        if sites is None:  # peft's model-level switches (ZeRO-3)
            return functools.partial(self._peft_role, role)
        if role == "reference" and self.reference_mode == "base":
            # peft's disable_adapter() where a layer's base_layer cannot be read (_compat)
            return sites.bypassed if sites.bypassable else functools.partial(self._peft_role, role)
        if role == "reference" and not torch.is_grad_enabled():
            # frozen: the base model where its delta is exactly zero (a reference copied
            # from a fresh actor), else its delta merged; both at base-model speed
            if sites.delta_is_zero(role) and sites.bypassable:
                return sites.bypassed
            return functools.partial(sites.merged, role)
        return functools.partial(sites.active, role)

    @contextlib.contextmanager
    def _peft_role(self, role: str) -> Iterator[None]:
        """``role`` through peft's model-level switches (ZeRO-3); the actor after."""
        try:
            if role == "reference" and self.reference_mode == "base":
                with self.peft.disable_adapter():  # type: ignore[union-attr]
                    yield
            else:
                self.peft.set_adapter(role)  # type: ignore[union-attr]
                yield
        finally:
            self._restore()

    @contextlib.contextmanager
    def merged_for_generation(self, enabled: bool = True) -> Iterator[None]:
        """Run the body (generation, no gradient) with the actor's LoRA delta merged.

        Each plain LoRA linear layer is replaced by one with weight ``W + scaling * B @ A``
        (see :meth:`rl_adapters.roles.LoraSites.merged`); the base weights are not written, so
        the model is bit-identical after the body. Logits differ from the unmerged forward by
        float rounding only (the sampler's log-probs record what was sampled from). Memory:
        one extra copy of the adapted base weights while the body runs. A no-op with
        ``enabled=False``, in full fine-tuning, and under ZeRO-3.
        """
        sites = self.lora_sites() if enabled else None
        if sites is None:
            yield
            return
        with sites.merged("actor"):
            yield

    @contextlib.contextmanager
    def lean_lora(self, enabled: bool = True) -> Iterator[None]:
        """Run the body (training forwards and backwards) through the lean LoRA forward.

        Each plain LoRA linear layer computes ``x W^T + b + s (x A^T) B^T`` as one autograd
        node that accumulates in place (:class:`rl_adapters.lean_lora.LeanLora`) instead of
        peft's five operations and their full-size temporaries; values and gradients equal
        peft's to float rounding. Role switches and activation checkpointing inside the body
        work as outside. The LoRA part is a no-op in full fine-tuning and under ZeRO-3.

        Also runs the lean rotary embedding (:func:`rl_adapters.lean_rotary.lean_rotary`),
        RMSNorm (:func:`rl_adapters.lean_norm.lean_rms_norm`) and SwiGLU gate
        (:func:`rl_adapters.lean_mlp.lean_swiglu`), each bit-equal to transformers' own step,
        for the whole body. Every swap is :func:`rl_adapters.replay.replayable`, so a layer
        checkpointed in the body recomputes with the swaps of its forward also when the backward
        runs after the body. Nothing changes with ``enabled=False`` or with the policy's
        ``lean_forwards=False``.
        """
        enabled = enabled and self.lean_forwards is not False
        sites = self.lora_sites() if enabled else None
        model = self.causal_lm
        with (
            replayable(functools.partial(lean_rotary, model, enabled)),
            replayable(functools.partial(lean_rms_norm, model, enabled)),
            replayable(functools.partial(lean_swiglu, model, enabled)),
            replayable(sites.lean) if sites is not None else contextlib.nullcontext(),
        ):
            yield

    def trainable_parameters(self, role: str | None = None) -> list[nn.Parameter]:
        """Parameters an optimizer should update: all (None), the actor's, or the critic's."""
        if role is not None and role not in ("actor", "critic"):
            raise ValueError(f"`role` must be None, 'actor' or 'critic', got {role!r}")
        if role == "critic" and not self.has_critic:
            raise ValueError("this model has no critic (`critic=False`)")
        params: list[nn.Parameter] = []
        if self.peft is None:
            if role in (None, "actor"):
                params += list(self.causal_lm.parameters())
        else:
            adapters = ("actor", "critic") if role is None else (role,)
            params += [
                p
                for n, p in self.peft.named_parameters()
                if any(is_lora_param_of(n, a) for a in adapters)
            ]
        if self.value_head is not None and role in (None, "critic"):
            params += list(self.value_head.parameters())
        return params

    # -- forwards --------------------------------------------------------------------------

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V, H] the output projection (tied to the embeddings or not)."""
        head = self.causal_lm.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise ValueError(f"unsupported output head {type(head).__name__}")
        return head.weight

    @property
    def lm_head_bias(self) -> torch.Tensor | None:
        """[V] the output projection's bias, or None."""
        head = self.causal_lm.get_output_embeddings()
        bias = getattr(head, "bias", None)
        return bias if isinstance(bias, torch.Tensor) else None

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        role: str = "actor",
        position_ids: torch.Tensor | None = None,
        **attention_kwargs: Any,
    ) -> torch.Tensor:
        """[N, L, H] last hidden states (final norm applied), without the lm_head.

        ``hidden @ lm_head_weight.T (+ lm_head_bias)`` are the model's logits.

        Args:
            input_ids: [N, L] token ids.
            attention_mask: [N, L] 1 for real tokens, 0 for padding; None for rows without
                padding (causal attention over every token) and for packed rows.
            role: Whose weights to run.
            position_ids: [N, L] positions, or None (0..L-1). A packed sequence ``[1, S]``
                passes ``attention_mask=None`` and positions restarting at 0 on every row:
                transformers then confines attention to each row (``rl_algos.packing``).
            **attention_kwargs: Passed to the attention layers (flash-attention's
                ``cu_seq_lens_q`` ... of packed rows).
        """
        self._check_role(role)
        if role == "reference" and self.reference_model is not None:
            model: PreTrainedModel = self.reference_model
        else:
            model = self.causal_lm
        offload = (
            torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
            if self.activation_offload
            else contextlib.nullcontext()
        )
        # every switch the forward reads is replayable (rl_adapters.replay): a checkpointed
        # layer recomputes, in the backward, with the role, the lean rotary, RMSNorm and SwiGLU
        # (bit-equal to transformers'; none with lean_forwards=False) and the checkpointing
        # flags of this forward. The offload
        # hooks are autograd's own saved-tensor hooks, which the recomputation replaces.
        lean = self.lean_forwards is not False
        with (
            self.use_role(role),
            offload,
            replayable(functools.partial(self._checkpointing, model)),
            replayable(functools.partial(lean_rotary, model, lean)),
            replayable(functools.partial(lean_rms_norm, model, lean)),
            replayable(functools.partial(lean_swiglu, model, lean)),
        ):
            out = decoder_of(model)(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                **attention_kwargs,
            )
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        assert isinstance(hidden, torch.Tensor)
        return hidden

    @contextlib.contextmanager
    def _checkpointing(self, model: nn.Module) -> Iterator[None]:
        """Make activation checkpointing happen in ``eval()`` mode while autograd records.

        transformers checkpoints a decoder layer only when that layer's own ``training`` flag
        is set, and the policy stays in ``eval()`` (dropout off), which would silently turn
        ``gradient_checkpointing=True`` into a no-op. The flag is set on the checkpointed layers
        themselves, not their submodules (dropout stays off), and only around a forward with
        autograd on (generation keeps its KV cache).

        Every checkpointing layer is checkpointed but the last (in module order: the last
        decoder layer), whose flag is cleared instead. Its recomputation would be the first
        thing the backward runs, right after the head's backward, so it would rebuild the
        activations that the forward had just dropped: keeping them costs the same layer's
        worth of memory at the same point of the step, and saves one layer's recomputation
        (``docs/benchmarks.md``, gradient checkpointing's memory).
        """
        if not (self.gradient_checkpointing and torch.is_grad_enabled()) or model is not (
            self.causal_lm
        ):
            yield
            return
        if self._checkpointed is None:
            from transformers.modeling_layers import GradientCheckpointingLayer

            self._checkpointed = [
                m
                for m in model.modules()
                if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
            ]
        layers = self._checkpointed
        flags = [m.training for m in layers]
        try:
            for i, m in enumerate(layers):
                m.training = i < len(layers) - 1
            yield
        finally:
            for m, flag in zip(layers, flags, strict=True):
                m.training = flag

    def logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, role: str = "actor"
    ) -> torch.Tensor:
        """[N, T, V] full logits (convenience for small models and tests)."""
        hidden = self.hidden_states(input_ids, attention_mask, role)
        if role == "reference" and self.reference_model is not None:
            head = self.reference_model.get_output_embeddings()
            assert isinstance(head, nn.Module)
            out = head(hidden)
            assert isinstance(out, torch.Tensor)
            return out
        return nn.functional.linear(hidden, self.lm_head_weight, self.lm_head_bias)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[N, T] the critic's value of every prefix (critic adapter + value head)."""
        if self.value_head is None:
            raise ValueError("this model has no critic: construct it with `critic=True`")
        values: torch.Tensor = self.value_head(
            self.hidden_states(input_ids, attention_mask, role="critic")
        )
        return values

    def sync_reference(self) -> None:
        """Copy the actor's weights onto the reference (adapter, or the frozen full copy)."""
        if self.reference_mode == "adapter" and self.peft is not None:
            copy_adapter(self.peft, "actor", "reference")
        elif self.reference_mode == "copy" and self.reference_model is not None:
            with torch.no_grad():
                self.reference_model.load_state_dict(self.causal_lm.state_dict())
        else:
            raise ValueError(
                f"cannot sync a reference in mode {self.reference_mode!r}: the 'base' reference is "
                "the frozen base by definition, and None has no reference"
            )
        self._restore()
