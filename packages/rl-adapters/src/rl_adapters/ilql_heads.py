r"""ILQL heads on a causal LM's hidden states: V, one or two Q heads and their target copies.

ILQL (Implicit Language Q-Learning, Snell et al., arXiv 2206.11871) puts three kinds of heads
on the last hidden state :math:`h_t` [..., H] of the language model (the state :math:`s_t`):

* ``v_head``: :math:`V_\psi(s_t)`, H -> 1;
* ``q_heads``: :math:`Q_{\theta_i}(s_t, \cdot)`, H -> V (one, or two for clipped double-Q);
* ``target_q_heads``: frozen copies :math:`Q_{\hat\theta_i}` updated by Polyak averaging,
  :math:`\hat\theta \leftarrow \alpha\theta + (1 - \alpha)\hat\theta`, every ``sync_every``
  optimizer steps (trlX's ``alpha`` and ``steps_for_target_q_sync``).

Each head is trlX's two-layer MLP (``Linear(H, 2H) -> ReLU -> Linear(2H, out)``) or, with
``mlp=False``, one linear layer. The heads read the hidden states of whatever trunk produced them
(a LoRA actor or a fully fine-tuned model), so they work with both; the trunk is trained through
them. Tensors are saved in safetensors and the configuration in JSON
(:meth:`ILQLHeads.save` / :meth:`ILQLHeads.load`, or inside an agent checkpoint with
``rl_adapters.save_checkpoint(..., heads={"ilql_heads": heads})``): no pickle.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from rl_adapters._checkpoint_read import CheckpointError, _load_tensors, _read_json
from rl_adapters.seeding import seeded

__all__ = ["ILQLHeads", "ILQLHeadsConfig", "ILQLHeadsOutput"]

WEIGHTS_FILE = "ilql_heads.safetensors"
CONFIG_FILE = "ilql_heads.json"
_CONFIG_KEY = "ilql_heads_config"  # the weights file's metadata entry holding the config (JSON)


def _config(path: Path, data: Any) -> ILQLHeadsConfig:
    """``data`` as the heads' configuration; a bad one is a CheckpointError naming ``path``."""
    try:
        return ILQLHeadsConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {exc}") from exc


def _metadata(path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file's header.

    Raises:
        CheckpointError: The file is not valid safetensors; the message names it.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint file {path.name} is not valid safetensors: {exc}"
        ) from exc


@dataclass(frozen=True)
class ILQLHeadsConfig:
    """Shape and update rule of :class:`ILQLHeads` (saved as JSON beside the weights)."""

    hidden_size: int
    """H, the trunk's hidden size."""
    vocab_size: int
    """V, the number of Q-values per state (the LM's vocabulary)."""
    two_qs: bool = True
    """Two Q heads (clipped double-Q: the target is their minimum) instead of one (trlX)."""
    alpha: float = 0.001
    r"""Polyak rate in [0, 1]: :math:`\hat\theta \leftarrow \alpha\theta + (1-\alpha)\hat\theta`
    (trlX ``alpha``; 1 copies the online heads)."""
    sync_every: int = 5
    """Optimizer steps between target updates (trlX ``steps_for_target_q_sync``), >= 1."""
    mlp: bool = True
    """trlX's two-layer heads (H -> 2H -> out, ReLU); False: a single linear layer."""

    def __post_init__(self) -> None:
        for name in ("two_qs", "mlp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)):
            raise ValueError(f"`alpha` must be a number in [0, 1], got {self.alpha!r}")
        for name in ("hidden_size", "vocab_size", "sync_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"`alpha` must be in [0, 1] (the Polyak rate), got {self.alpha}")

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON types."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ILQLHeadsConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown ILQL head config keys {unknown}; known: {sorted(names)}")
        return cls(**data)


class ILQLHeadsOutput(NamedTuple):
    """What the heads compute for hidden states [..., H]."""

    qs: tuple[torch.Tensor, ...]
    """Q-values over the vocabulary [..., V], one per Q head (differentiable)."""
    target_qs: tuple[torch.Tensor, ...]
    """The target heads' Q-values [..., V] (no gradient)."""
    values: torch.Tensor
    """V(s) [...] (differentiable)."""


def _head(hidden: int, out: int, mlp: bool) -> nn.Module:
    if not mlp:
        return nn.Linear(hidden, out)
    return nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, out))


class ILQLHeads(nn.Module):
    """V head, Q head(s) and Polyak-averaged target Q head(s) (see the module docstring).

    Args:
        config: Shapes and target-update rule.
        seed: Seed of the initialisation, drawn from a private generator state (the caller's
            global RNG is untouched). The target heads start equal to the Q heads.
    """

    def __init__(self, config: ILQLHeadsConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ILQLHeadsConfig):
            raise TypeError(f"`config` must be an ILQLHeadsConfig, got {type(config).__name__}")
        self.config = config
        n = 2 if config.two_qs else 1
        with seeded(seed):  # the heads are built on the CPU
            self.v_head = _head(config.hidden_size, 1, config.mlp)
            self.q_heads = nn.ModuleList(
                _head(config.hidden_size, config.vocab_size, config.mlp) for _ in range(n)
            )
            self.target_q_heads = nn.ModuleList(
                _head(config.hidden_size, config.vocab_size, config.mlp) for _ in range(n)
            )
        self.target_q_heads.load_state_dict(self.q_heads.state_dict())
        self.target_q_heads.requires_grad_(False)

    @classmethod
    def for_model(cls, model: nn.Module, *, seed: int = 0, **options: Any) -> ILQLHeads:
        """Heads sized for a transformers model (``config.hidden_size``, ``vocab_size``).

        Args:
            model: A transformers causal LM (or anything with such a ``config``).
            seed: Initialisation seed.
            **options: Other :class:`ILQLHeadsConfig` fields (``two_qs``, ``alpha``, ...).
        """
        config = getattr(model, "config", None)
        hidden = getattr(config, "hidden_size", None)
        vocab = getattr(config, "vocab_size", None)
        if not isinstance(hidden, int) or not isinstance(vocab, int):
            raise ValueError(
                f"cannot size ILQL heads for {type(model).__name__}: its config has no integer "
                "hidden_size and vocab_size; build ILQLHeadsConfig by hand"
            )
        return cls(ILQLHeadsConfig(hidden_size=hidden, vocab_size=vocab, **options), seed=seed)

    @property
    def num_q_heads(self) -> int:
        """1 or 2."""
        return len(self.q_heads)

    def _input(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"`hidden` has shape {list(hidden.shape)} but the heads expect [..., H] with "
                f"H = {self.config.hidden_size}"
            )
        return hidden.to(next(self.v_head.parameters()).dtype)

    def forward(self, hidden: torch.Tensor) -> ILQLHeadsOutput:
        """Q-values, target Q-values and V for hidden states [..., H]."""
        h = self._input(hidden)
        qs = tuple(head(h) for head in self.q_heads)
        with torch.no_grad():
            target_qs = tuple(head(h.detach()) for head in self.target_q_heads)
        values = self.v_head(h).squeeze(-1)
        return ILQLHeadsOutput(qs, target_qs, values)

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """V(s) [...] for hidden states [..., H]."""
        out: torch.Tensor = self.v_head(self._input(hidden)).squeeze(-1)
        return out

    @torch.no_grad()
    def reduced_q(
        self, hidden: torch.Tensor, reduction: str = "min", *, target: bool = True
    ) -> torch.Tensor:
        """Q-values [..., V] of the target (or online) heads, reduced over the heads.

        Args:
            hidden: [..., H] hidden states.
            reduction: ``"min"`` (clipped double-Q, trlX) or ``"mean"``.
            target: Use the target heads (trlX's decoding) or the online ones.
        """
        if reduction not in ("min", "mean"):
            raise ValueError(f"`reduction` must be 'min' or 'mean', got {reduction!r}")
        h = self._input(hidden)
        heads = self.target_q_heads if target else self.q_heads
        stacked = torch.stack([head(h) for head in heads])
        return stacked.amin(0) if reduction == "min" else stacked.mean(0)

    def target_q(self, hidden: torch.Tensor, reduction: str = "min") -> torch.Tensor:
        """The target heads' Q-values [..., V], reduced over heads (``"min"`` or ``"mean"``)."""
        return self.reduced_q(hidden, reduction, target=True)

    @torch.no_grad()
    def advantages(
        self, hidden: torch.Tensor, reduction: str = "min", use_target: bool = True
    ) -> torch.Tensor:
        r""":math:`Q(s, \cdot) - V(s)` [..., V] for decoding (trlX: target heads, min)."""
        q = self.reduced_q(hidden, reduction, target=use_target)
        return q - self.values(hidden)[..., None]

    # -- target heads -------------------------------------------------------------------------

    @torch.no_grad()
    def sync_target(self, alpha: float | None = None) -> None:
        r"""Polyak update :math:`\hat\theta \leftarrow \alpha\theta + (1-\alpha)\hat\theta`.

        Args:
            alpha: Rate in [0, 1]; default ``config.alpha``. 1 copies the Q heads.
        """
        rate = self.config.alpha if alpha is None else alpha
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"`alpha` must be in [0, 1], got {rate}")
        for target, online in zip(self.target_q_heads, self.q_heads, strict=True):
            for tp, p in zip(target.parameters(), online.parameters(), strict=True):
                tp.lerp_(p.detach().to(tp.dtype), rate)

    def maybe_sync(self, step: int) -> bool:
        """Polyak-update the targets when ``step`` is a multiple of ``sync_every``.

        Args:
            step: Optimizer steps taken so far.

        Returns:
            Whether the targets were updated.
        """
        if step > 0 and step % self.config.sync_every == 0:
            self.sync_target()
            return True
        return False

    def trainable_parameters(self) -> list[nn.Parameter]:
        """V and Q head parameters (the target heads are never trained)."""
        return [*self.v_head.parameters(), *self.q_heads.parameters()]

    def train(self, mode: bool = True) -> ILQLHeads:
        """Sets the mode; the target heads always stay frozen."""
        super().train(mode)
        self.target_q_heads.requires_grad_(False)
        return self

    # -- files ---------------------------------------------------------------------------------

    def tensors(self) -> dict[str, torch.Tensor]:
        """The state dict as contiguous CPU tensors (what safetensors stores)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}

    def load_tensors(self, tensors: dict[str, torch.Tensor], where: str = "tensors") -> None:
        """Load a state dict.

        Raises:
            ValueError: Missing, unexpected or mis-shaped keys (named in the message).
        """
        mine = self.state_dict()
        missing = sorted(set(mine) - set(tensors))
        unexpected = sorted(set(tensors) - set(mine))
        if missing or unexpected:
            raise ValueError(
                f"{where} do not fit these ILQL heads: missing {missing[:4]}, unexpected "
                f"{unexpected[:4]} (built with two_qs={self.config.two_qs}, mlp={self.config.mlp})"
            )
        for key, value in tensors.items():
            if value.shape != mine[key].shape:
                raise ValueError(
                    f"{where}: {key} has shape {list(value.shape)}, the heads' is "
                    f"{list(mine[key].shape)}"
                )
        self.load_state_dict(tensors)
        self.target_q_heads.requires_grad_(False)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``ilql_heads.safetensors`` and ``ilql_heads.json`` into ``directory``.

        Each file is written aside, flushed to disk and renamed into place once complete, the
        JSON first; the weights file carries the configuration in its metadata too, and
        :meth:`load` reads that one. So a save cut off at any point (a full disk, a kill)
        leaves the previous heads loadable as they were.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict()
        aside = {name: out / f".{name}.tmp" for name in (WEIGHTS_FILE, CONFIG_FILE)}
        try:
            save_file(self.tensors(), str(aside[WEIGHTS_FILE]),
                      metadata={_CONFIG_KEY: json.dumps(config)})  # fmt: skip
            aside[CONFIG_FILE].write_text(json.dumps(config, indent=2) + "\n")
            for path in aside.values():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            os.replace(aside[CONFIG_FILE], out / CONFIG_FILE)
            os.replace(aside[WEIGHTS_FILE], out / WEIGHTS_FILE)
        finally:
            for path in aside.values():
                path.unlink(missing_ok=True)
        return out

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ILQLHeads:
        """Rebuild heads saved by :meth:`save` (reads only safetensors and JSON).

        The configuration is the one in the weights file's metadata (heads saved before it
        was written there: the JSON's); a JSON that disagrees with it is left from a save that
        was cut off between its two renames, and a warning says so.

        Raises:
            FileNotFoundError: ``directory`` lacks one of the two files.
            CheckpointError: A file is corrupted or truncated, or the config holds unknown keys;
                the message names the file.
        """
        root = Path(directory)
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            if not (root / name).is_file():
                raise FileNotFoundError(f"{root} has no {name}: not a saved ILQLHeads directory")
        config = _config(root / CONFIG_FILE, _read_json(root / CONFIG_FILE))
        embedded = _metadata(root / WEIGHTS_FILE).get(_CONFIG_KEY)
        if embedded is not None:
            try:
                stored = _config(root / WEIGHTS_FILE, json.loads(embedded))
            except ValueError as exc:  # json's errors are ValueErrors
                if isinstance(exc, CheckpointError):
                    raise
                raise CheckpointError(f"{root / WEIGHTS_FILE}: its config is not JSON") from exc
            if stored != config:
                warnings.warn(
                    f"{root / CONFIG_FILE} differs from the configuration saved with "
                    f"{WEIGHTS_FILE} (a save was cut off between its renames); loading the "
                    "heads as the weights file saved them",
                    RuntimeWarning,
                    stacklevel=2,
                )
            config = stored
        heads = cls(config)
        heads.load_tensors(_load_tensors(root / WEIGHTS_FILE), where=str(root / WEIGHTS_FILE))
        return heads
