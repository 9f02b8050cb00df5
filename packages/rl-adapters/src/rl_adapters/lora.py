"""LoRA configuration helpers: defaults, validation against the model, comparison."""

from __future__ import annotations

import copy
import re
import warnings
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from peft import LoraConfig

__all__ = [
    "comparable_lora_config",
    "default_lora_config",
    "linear_module_names",
    "match_dropout_mode",
    "scope_lora_config",
    "validate_lora_config",
]

#: Fields that change what an adapter computes; compared when loading a checkpoint.
COMPARED_FIELDS = (
    "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "bias", "use_rslora",
    "use_dora", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern",
)  # fmt: skip


def linear_module_names(model: nn.Module) -> list[str]:
    """Short names of the model's ``nn.Linear`` layers except the output head (LoRA targets)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not head
    }
    return sorted(names)


def default_lora_config(model: nn.Module) -> LoraConfig:
    """The config used when none is given: r = 8, alpha = 16, every linear layer but lm_head."""
    warnings.warn(
        "no `lora_config` given: using LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, "
        f"target_modules={linear_module_names(model)}); pass one to choose",
        UserWarning,
        stacklevel=3,
    )
    from peft import LoraConfig  # peft is heavy: imported only when LoRA is used

    return LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=linear_module_names(model)
    )


#: ``init_lora_weights`` values with which peft rewrites the base weights it wraps (or, "mica",
#: freezes ``lora_B``, which the policy's trainable set would train again).
UNSHARED_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga", "mica")


def validate_lora_config(config: LoraConfig, model: nn.Module) -> LoraConfig:
    """Check the config against the model; return a private copy.

    Its target modules must exist, must not include the output head (the policy reads the
    head's plain weight), and it must train LoRA weights only on an untouched base: the roles
    (or agents) share one frozen base, and only their LoRA weights are trainable.

    Raises:
        TypeError: ``config`` is not a ``peft.LoraConfig``.
        ValueError: Targets the model does not have or its output head, a ``bias`` other than
            ``"none"``, ``modules_to_save``, ``trainable_token_indices``, or an
            ``init_lora_weights`` that rewrites the base weights (names the field).
    """
    from peft import LoraConfig  # peft is heavy: imported only when LoRA is used

    if not isinstance(config, LoraConfig):
        raise TypeError(f"`lora_config` must be a peft.LoraConfig, got {type(config).__name__}")
    config = copy.deepcopy(config)
    _check_trains_lora_only(config, model)
    targets = config.target_modules
    if targets is None or isinstance(targets, str):
        return config  # "all-linear" or a regex: peft validates it
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    full = {name for name, _ in model.named_modules()}
    missing = sorted(t for t in targets if t not in names and t not in full)
    if missing:
        raise ValueError(
            f"`lora_config` targets {missing}, which the model does not have; its linear layers "
            f"are {linear_module_names(model)}"
        )
    return config


def _check_trains_lora_only(config: LoraConfig, model: nn.Module) -> None:
    """Refuse what would train (or rewrite) more than each adapter's own LoRA weights."""
    from peft.tuners.tuners_utils import check_target_module_exists

    shared = "the roles share one frozen base and train only their LoRA weights"
    if config.bias != "none":
        raise ValueError(
            f"`lora_config.bias`={config.bias!r} would train the shared base's biases, but "
            f"{shared}: pass bias='none' (or lora_bias=True for a bias per adapter)"
        )
    for field in ("modules_to_save", "trainable_token_indices"):
        if getattr(config, field, None):
            raise ValueError(
                f"`lora_config.{field}` is not supported ({shared}; those copies would stay "
                f"untrained): pass {field}=None and target the modules with LoRA instead"
            )
    init = config.init_lora_weights
    if isinstance(init, str) and init.lower().startswith(UNSHARED_INITS):
        what = "freezes lora_B" if init == "mica" else "rewrites the base weights, once per adapter"
        raise ValueError(
            f"`lora_config.init_lora_weights`={init!r} {what}, but {shared}: pass True, "
            "'gaussian' or 'orthogonal'"
        )
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    for name, module in model.named_modules():
        if head is not None and module is head and check_target_module_exists(config, name):
            raise ValueError(
                f"`lora_config.target_modules` selects the output head {name!r}, whose plain "
                "weight the policy's log-probs read: leave it out (e.g. "
                "target_modules='all-linear')"
            )


def scope_lora_config(config: LoraConfig, model: nn.Module, scope: str) -> LoraConfig:
    """Restrict a config's targets to the language model of a multimodal model.

    ``scope="language"`` on a model with a ``language_model`` submodule (LLaVA, Qwen-VL, ...)
    turns the target names into a regex matching only modules under it, so the vision tower
    and the projector get no LoRA; on a text-only model, and with ``scope="all"``, the config is
    returned unchanged.
    """
    if scope not in ("language", "all"):
        raise ValueError(f"`lora_target_scope` must be 'language' or 'all', got {scope!r}")
    prefixes = [name for name, _ in model.named_modules() if name.endswith("language_model")]
    if scope == "all" or not prefixes:
        return config
    prefix = min(prefixes, key=len)
    targets = config.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        raise ValueError(
            "`lora_target_scope='language'` cannot rewrite a regex `target_modules`: write the "
            "scope into the regex, or pass lora_target_scope='all'"
        )
    if targets is None or isinstance(targets, str):
        language = model.get_submodule(prefix)
        names = sorted(
            {n.rsplit(".", 1)[-1] for n, m in language.named_modules() if isinstance(m, nn.Linear)}
        )
    else:
        names = sorted(targets)
    scoped = copy.deepcopy(config)
    scoped.target_modules = rf"{re.escape(prefix)}\..*\.({'|'.join(map(re.escape, names))})"
    return scoped


def match_dropout_mode(model: nn.Module, training: bool) -> None:
    """Put every LoRA dropout of ``model`` in ``training`` mode (the wrapped model's mode).

    peft builds each adapter's ``lora_dropout`` modules in training mode whatever the mode of
    the model it wraps, so an ``eval()`` model would run live LoRA dropout.
    """
    for module in model.modules():
        dropout = getattr(module, "lora_dropout", None)
        if isinstance(dropout, nn.ModuleDict):
            dropout.train(training)


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items())}
    return value


def comparable_lora_config(config: LoraConfig) -> dict[str, Any]:
    """The fields of ``COMPARED_FIELDS`` as JSON types (sets sorted), for saving and comparing."""
    raw = config.to_dict()
    return {key: _jsonable(raw.get(key)) for key in COMPARED_FIELDS}
