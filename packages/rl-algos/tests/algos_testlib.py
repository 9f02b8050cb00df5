"""Tiny models, a hand-built experience batch and float64 references for the rl-algos tests.

The references re-derive each agent's loss from the spec (``/work/spec/rl_algos_spec.md``) by
composing rl-advantages and rl-losses directly, in float64, on a deep copy of the agent's
``PolicyModel`` taken before ``learn()``. Log-probs come from full logits
(``PolicyModel.logits``), not from rl-kernels' fused path, so the agent (float32, fused) and the
reference (float64, plain) share no numerical code beyond the model definition.

Batch layout (``B = 2`` prompts, ``G = 3`` samples each, ``N = 6`` rows, ``L = 12``): prompts of
different lengths, completions of different lengths right-padded with the pad id 0, one row with
no padding at all, and rows whose completion ends in EOS (id 2, an action token that is not pad).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import rl_advantages
import rl_losses
import torch
from peft import LoraConfig
from rl_adapters import PolicyModel
from rl_testing.models import tiny_causal_lm
from rl_testing.tolerance import assert_close
from torch import nn
from transformers import PreTrainedModel

PAD_ID = 0
PAD_TOKEN = "<pad>"
BOS_ID = 1
EOS_ID = 2
GROUP_SIZE = 3
N_PROMPTS = 2
N_ROWS = N_PROMPTS * GROUP_SIZE
SEQ_LEN = 12
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Prompts (BOS + tokens) and completions; ids 8.. are ordinary characters of the char tokenizer
# (vocabulary of 59). Rows 0 and 3 end in EOS, row 2 fills the whole length L (no padding).
PROMPTS: tuple[tuple[int, ...], ...] = ((BOS_ID, 10, 11, 12), (BOS_ID, 20, 21))
COMPLETIONS: tuple[tuple[int, ...], ...] = (
    (30, 31, 32, EOS_ID),
    (33, 34),
    (35, 36, 37, 38, 39, 40, 41, 42),
    (43, 44, 45, EOS_ID),
    (46,),
    (47, 48, 49, 50, 51),
)
# Distinct rewards in both groups, so every group-relative advantage is non-zero.
REWARDS: tuple[float, ...] = (1.0, 0.25, -0.5, 2.0, 0.0, 0.75)


# --------------------------------------------------------------------------- models


def tiny_model(seed: int = 0) -> PreTrainedModel:
    """A tiny random-weight Qwen2 (rl_testing defaults: hidden 64, 2 layers), float32, CPU."""
    model, _ = tiny_causal_lm("qwen2", seed=seed)
    return model


def lora_config(r: int = 4, alpha: int = 8) -> LoraConfig:
    """A fresh LoRA config on every linear layer, no dropout (deterministic forwards)."""
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LINEAR_NAMES))


def named_params(module: nn.Module) -> dict[str, nn.Parameter]:
    return dict(module.named_parameters())


def names_of(module: nn.Module, params: Iterable[torch.Tensor]) -> list[str]:
    """Names (in ``module``) of ``params``; fails for a parameter ``module`` does not own."""
    by_id = {id(p): n for n, p in module.named_parameters()}
    out = []
    for p in params:
        assert id(p) in by_id, "parameter not found in the policy"
        out.append(by_id[id(p)])
    return out


def is_lora_of(name: str, adapter: str) -> bool:
    return f".{adapter}." in name and ".lora_" in name


@torch.no_grad()
def perturb_adapter(
    policy: nn.Module, adapter: str = "actor", seed: int = 0, scale: float = 0.1
) -> None:
    """Adds seeded Gaussian noise to every ``lora_B`` weight of ``adapter`` (B is 0 at init).

    After this the actor differs from the reference (so the KL term is non-trivial) and both
    LoRA factors of the actor receive non-zero gradients.
    """
    gen = torch.Generator().manual_seed(seed)
    hit = 0
    for name, p in sorted(policy.named_parameters(), key=lambda kv: kv[0]):
        if is_lora_of(name, adapter) and ".lora_B." in name:
            noise = torch.randn(
                p.shape, generator=gen, dtype=torch.float64
            )  # drawn on CPU: any device
            p.add_(scale * noise.to(device=p.device, dtype=p.dtype))
            hit += 1
    assert hit > 0, f"no lora_B weights found for adapter {adapter!r}"


def state_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Detached clones of the full state dict (parameters and buffers), keyed by name."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed_keys(before: Mapping[str, torch.Tensor], module: nn.Module) -> set[str]:
    """Names whose current value is not bit-identical to the snapshot."""
    after = module.state_dict()
    assert set(after) == set(before), "the state dict's keys changed"
    # bit-exact: any change at all counts
    return {k for k, v in before.items() if not torch.equal(v, after[k].detach())}


# --------------------------------------------------------------------------- batch


@dataclass(frozen=True)
class Batch:
    """One hand-built experience batch (the three learn inputs plus derived views)."""

    ids: torch.Tensor  # [N, L] long, right-padded with PAD_ID
    masks: torch.Tensor  # [N, L-1] bool
    rewards: torch.Tensor  # [N] float32
    lengths: tuple[int, ...] = field(default=())  # unpadded length of each row

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])

    def experiences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fresh copies (an agent must not be able to corrupt the test's copy)."""
        return self.ids.clone(), self.masks.clone(), self.rewards.clone()


def make_batch(
    prompts: Sequence[Sequence[int]] = PROMPTS,
    completions: Sequence[Sequence[int]] = COMPLETIONS,
    rewards: Sequence[float] = REWARDS,
    group_size: int = GROUP_SIZE,
    seq_len: int = SEQ_LEN,
) -> Batch:
    """Rows ``prompt[n // G] + completion[n]``, right-padded to ``seq_len`` with PAD_ID.

    ``masks[n, t]`` is True exactly when token ``t + 1`` is a completion (action) token.
    """
    n = len(completions)
    assert n == len(rewards) and n % group_size == 0
    ids = torch.full((n, seq_len), PAD_ID, dtype=torch.long)
    masks = torch.zeros((n, seq_len - 1), dtype=torch.bool)
    lengths = []
    for row, comp in enumerate(completions):
        prompt = prompts[row // group_size]
        seq = [*prompt, *comp]
        assert len(seq) <= seq_len
        ids[row, : len(seq)] = torch.tensor(seq)
        masks[row, len(prompt) - 1 : len(seq) - 1] = True
        lengths.append(len(seq))
    return Batch(ids, masks, torch.tensor(rewards, dtype=torch.float32), tuple(lengths))


def attention_from(ids: torch.Tensor, masks: torch.Tensor, pad_id: int = PAD_ID) -> torch.Tensor:
    """The spec's attention mask: 1 up to and including the last non-pad or action position."""
    valid = ids != pad_id
    valid[:, 1:] |= masks.bool()
    pos = torch.arange(ids.shape[1])
    last = torch.where(valid, pos, -1).amax(dim=1)
    return (pos[None, :] <= last[:, None]).long()


def split_groups(
    batch: Batch, group_size: int = GROUP_SIZE
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The list form of the inputs: one ``[G, L_b]`` / ``[G, L_b - 1]`` tensor per prompt,
    trimmed to the longest row of the group (so the groups have different widths)."""
    ids_list, mask_list = [], []
    for start in range(0, batch.n, group_size):
        width = max(batch.lengths[start : start + group_size])
        ids_list.append(batch.ids[start : start + group_size, :width].clone())
        mask_list.append(batch.masks[start : start + group_size, : width - 1].clone())
    return ids_list, mask_list


# --------------------------------------------------------------------------- float64 reference


def float64_copy(policy: nn.Module) -> nn.Module:
    """A float64 deep copy (same parameter names, same roles, same trainable flags)."""
    twin = copy.deepcopy(policy).double()
    for p in twin.parameters():
        p.grad = None
    return twin


def reference_logprobs(
    model_or_policy: nn.Module,
    ids: torch.Tensor,
    attention: torch.Tensor,
    role: str = "actor",
    temperature: float = 1.0,
) -> torch.Tensor:
    """``lp[n, t] = log_softmax(logits[n, t] / temperature)[ids[n, t + 1]]`` from full logits.

    ``model_or_policy`` is a ``PolicyModel`` (``role`` picks the adapter) or a plain causal LM
    (``role`` must then be ``"actor"``). Computed in the module's dtype (float64 for a
    :func:`float64_copy`); gradients flow unless called under ``no_grad``.
    """
    if isinstance(model_or_policy, PolicyModel):
        logits = model_or_policy.logits(ids, attention, role=role)
    else:
        assert role == "actor", "a plain model has no roles"
        logits = model_or_policy(input_ids=ids, attention_mask=attention).logits
    logp = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


@dataclass
class RefLoss:
    """A reference loss (with its graph) and its detached parts."""

    loss: torch.Tensor
    parts: dict[str, float]


def _lp_old_ref(
    policy: PolicyModel, batch: Batch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    att = attention_from(batch.ids, batch.masks)
    lp = reference_logprobs(policy, batch.ids, att, "actor", temperature)
    old_lp = lp.detach().clone()  # update_epochs=1: the old policy is the current one
    with torch.no_grad():
        ref_lp = reference_logprobs(policy, batch.ids, att, "reference", temperature)
    return lp, old_lp, ref_lp, att


def grpo_clip_kwargs(loss_type: str, clip_coef: Any) -> dict[str, Any]:
    """The spec's mapping of ``clip_coef`` to rl-losses keyword arguments (``_UNSET`` = not
    passed to the agent)."""
    if loss_type == "cispo":
        return {"clamp": "upper", "eps_high": 4.0}
    if loss_type == "gspo":
        if clip_coef is UNSET:
            return {"clip_low": 3e-4, "clip_high": 4e-4}
        return {"clip_low": float(clip_coef), "clip_high": float(clip_coef)}
    c = 0.2 if clip_coef is UNSET else clip_coef  # GRPO's default clip_coef=0.2
    if isinstance(c, tuple):
        return {"ratio_bounds": (float(c[0]), float(c[1]))}
    return {"clip_low": float(c), "clip_high": float(c)}


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""Marks a keyword argument left at the agent's default."""


def reference_loss_grpo(
    policy: PolicyModel,
    batch: Batch,
    *,
    group_size: int,
    beta: float,
    temperature: float,
    loss_type: str = "grpo",
    clip_coef: Any = UNSET,
    aggregation: str = "seq_mean_token_mean",
    adv_norm: str = "mean_std",
) -> RefLoss:
    """Spec "GRPO math", steps 1-5 (token level, one epoch, one mini-batch), in float64."""
    lp, old_lp, ref_lp, _ = _lp_old_ref(policy, batch, temperature)
    m = batch.masks
    r = batch.rewards.double().reshape(-1)
    scale = "group" if adv_norm == "mean_std" else "none"
    adv = rl_advantages.group_relative(r, group_size, scale=scale)
    kw = grpo_clip_kwargs(loss_type, clip_coef)
    pg: Any
    if loss_type == "grpo":
        pg = rl_losses.clipped_surrogate(lp, old_lp, adv, m, aggregation=aggregation, **kw)
    elif loss_type == "gspo":
        pg = rl_losses.gspo_loss(lp, old_lp, adv, m, aggregation=aggregation, **kw)
    elif loss_type == "cispo":
        pg = rl_losses.cispo_loss(lp, old_lp, adv, m, aggregation=aggregation, **kw)
    else:  # pragma: no cover - test bug
        raise AssertionError(loss_type)
    kl = rl_losses.kl_penalty(lp, ref_lp, m, kind="k3", coef=beta, aggregation=aggregation)
    loss = pg.loss + kl.loss
    return RefLoss(loss, {"pg_loss": float(pg.loss.detach()), "kl_loss": float(kl.loss.detach())})


def reference_loss_reinforce(
    policy: PolicyModel,
    batch: Batch,
    *,
    beta: float,
    temperature: float,
    clip_coef: float | None,
) -> RefLoss:
    """Spec "LLMREINFORCE math" (single turn, gamma=1, one epoch), in float64."""
    lp, old_lp, ref_lp, _ = _lp_old_ref(policy, batch, temperature)
    m = batch.masks
    returns = batch.rewards.double().reshape(-1, 1)  # one turn per row: G = r
    adv = rl_advantages.rebn(returns, mask=torch.ones_like(returns, dtype=torch.bool))[:, 0]
    if clip_coef is None:
        pg = rl_losses.reinforce_loss(lp, old_lp, adv, m, aggregation="token_mean")
    else:
        pg = rl_losses.clipped_surrogate(
            lp, old_lp, adv, m, level="token", aggregation="token_mean", clip_low=clip_coef
        )
    kl = rl_losses.kl_penalty(lp, ref_lp, m, kind="k3", coef=beta, aggregation="token_mean")
    loss = pg.loss + kl.loss
    return RefLoss(loss, {"pg_loss": float(pg.loss.detach()), "kl_loss": float(kl.loss.detach())})


def turn_values(values: torch.Tensor, masks: torch.Tensor, reduction: str) -> torch.Tensor:
    """[N] the value of each row's single turn: at its first action position, or the mean."""
    m = masks.bool()
    if reduction == "first":
        first = m.to(torch.int64).argmax(dim=1)
        return values[:, :-1].gather(1, first[:, None])[:, 0]
    assert reduction == "mean", reduction
    v = torch.where(m, values[:, :-1], 0.0)
    return v.sum(dim=1) / m.sum(dim=1).to(v.dtype)


def reference_loss_ppo(
    policy: PolicyModel,
    batch: Batch,
    *,
    beta: float,
    temperature: float,
    clip_coef: float,
    vf_coef: float,
    gamma: float,
    gae_lambda: float,
    cliprange_value: float | None,
    turn_value_reduction: str,
) -> RefLoss:
    """Spec "LLMPPO math" (single turn, turn-level GAE, one epoch), in float64."""
    lp, old_lp, ref_lp, att = _lp_old_ref(policy, batch, temperature)
    m = batch.masks
    values = policy.values(batch.ids, att)  # [N, L], with gradient into critic + head
    v = turn_values(values, m, turn_value_reduction)[:, None]  # [N, 1]
    v_old = v.detach().clone()
    r = batch.rewards.double().reshape(-1, 1)
    ones = torch.ones_like(r, dtype=torch.bool)
    gae = rl_advantages.gae(r, v_old, ones, gamma, lmbda=gae_lambda)
    pg = rl_losses.clipped_surrogate(
        lp, old_lp, gae.advantages[:, 0], m, aggregation="token_mean", clip_low=clip_coef
    )
    vl = rl_losses.value_loss(v, v_old, gae.returns, ones, clip=cliprange_value)
    kl = rl_losses.kl_penalty(lp, ref_lp, m, kind="k3", coef=beta, aggregation="token_mean")
    loss = pg.loss + vf_coef * vl.loss + kl.loss
    parts = {
        "pg_loss": float(pg.loss.detach()),
        "value_loss": float(vl.loss.detach()),
        "kl_loss": float(kl.loss.detach()),
    }
    return RefLoss(loss, parts)


def reference_grads(
    twin: nn.Module, loss_fn: Callable[[nn.Module], RefLoss], names: Iterable[str]
) -> tuple[RefLoss, dict[str, torch.Tensor]]:
    """Runs ``loss_fn`` on the float64 ``twin``, backpropagates, returns the loss and the
    gradients of the parameters called ``names`` (zeros where autograd left None)."""
    out = loss_fn(twin)
    out.loss.backward()
    params = named_params(twin)
    grads = {}
    for n in names:
        g = params[n].grad
        grads[n] = torch.zeros_like(params[n]) if g is None else g.detach().clone()
    return out, grads


def agent_grads(policy: nn.Module, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """``.grad`` of the named parameters (float64 for comparison; zeros where None)."""
    params = named_params(policy)
    out = {}
    for n in names:
        g = params[n].grad
        out[n] = (torch.zeros_like(params[n]) if g is None else g.detach()).double()
    return out


# --------------------------------------------------------------------------- tolerances

# Two routes to one loss or gradient of the tiny model (a float32 agent against the float64
# reference, micro-batches against the whole batch, packed rows against padded ones, fused
# against plain log-probs) agree to float32 rounding: `rl_testing.tolerance`, with the model's
# honest sizes. REDUCTION: the longest sum behind one element, the MLP's intermediate size 128
# (longer than the batch's 72 tokens, the hidden size 64 and the vocabulary of 59).
# LOSS_STAGES: the chained reductions from the weights to the loss: 2 decoder layers, the head
# with its log-softmax, the loss's mean. GRAD_STAGES: the forward and then the backward chain.
REDUCTION = 128
LAYERS = 2
LOSS_STAGES = LAYERS + 2
GRAD_STAGES = 2 * LOSS_STAGES


def assert_loss_close(
    actual: float,
    expected: float,
    *,
    scale: float = 1.0,
    stages: int = LOSS_STAGES,
    msg: str = "loss",
) -> None:
    """Two routes' float32 losses (or one against the float64 reference) agree to rounding.

    ``scale``: the size of the summed terms. The losses cancel terms of the size of the
    advantages (the group-normalised rewards, ~1): the default 1, or ``|expected|`` where larger.
    """
    scale = max(scale, abs(expected))
    assert_close(
        torch.tensor(actual, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        reduction=REDUCTION,
        stages=stages,
        scale=scale,
        dtype=torch.float32,
        msg=msg,
    )


def assert_grads_close(
    actual: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    stages: int = GRAD_STAGES,
    msg: str = "grad",
) -> None:
    """Gradients of two routes agree to float32 rounding, each tensor at the scale of its
    largest entry (:func:`agent_grads` casts to float64: the comparison is float32's)."""
    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    for name, e in expected.items():
        assert_close(
            actual[name],
            e,
            reduction=REDUCTION,
            stages=stages,
            dtype=torch.float32,
            msg=f"{msg} {name}",
        )


# --------------------------------------------------------------------------- agents

# Shared settings of the reference tests: one epoch, one optimizer step over the whole batch, no
# clipping of the gradient (so `.grad` is the raw gradient of the loss), a real learning rate
# (the weights do move; the gradient is that of the loss at the pre-update weights).
BETA = 0.05
TEMPERATURE = 0.7
LR = 1e-3
PPO_KW: dict[str, Any] = {
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "vf_coef": 0.5,
    "cliprange_value": 0.2,
    "critic_lr": 1e-3,
    "turn_value_reduction": "first",
    "whiten_advantages": False,  # the spec's GAE-only advantages; whitening is tested apart
}


def agent_kwargs(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments common to every agent (override per test)."""
    kw: dict[str, Any] = {
        "pad_token_id": PAD_ID,
        "pad_token": PAD_TOKEN,
        "lora_config": lora_config(),
        "batch_size": 8,  # >= N: one mini-batch, one optimizer step per epoch
        "beta": BETA,
        "lr": LR,
        "max_grad_norm": None,
        "update_epochs": 1,
        "temperature": TEMPERATURE,
        "micro_batch_size_per_gpu": None,
        "device": "cpu",
        "seed": 42,
    }
    kw.update(overrides)
    return kw


def make_agent(
    algo: str, *, model_seed: int = 0, perturb_seed: int | None = 1, **overrides: Any
) -> Any:
    """Builds ``rl_algos.<algo>`` on a fresh tiny model; perturbs the actor adapter unless
    ``perturb_seed`` is None. GRPO-family agents get ``group_size=GROUP_SIZE``, LLMPPO the
    explicit :data:`PPO_KW` (so no test depends on an unspecified default)."""
    import rl_algos

    cls = getattr(rl_algos, algo)
    extra: dict[str, Any] = {}
    if algo in ("GRPO", "GSPO", "CISPO"):
        extra["group_size"] = GROUP_SIZE
    elif algo == "LLMPPO":
        extra.update(PPO_KW)
    kw = agent_kwargs(**{**extra, **overrides})
    agent = cls(actor_network=tiny_model(model_seed), **kw)
    if perturb_seed is not None:
        perturb_adapter(agent.policy, "actor", seed=perturb_seed)
    return agent


def trainable_names(agent: Any, with_critic: bool = False) -> list[str]:
    """Names (in ``agent.policy``) of the actor's (and optionally the critic's) parameters."""
    params = list(agent.actor_parameters())
    if with_critic:
        params += list(agent.policy.trainable_parameters("critic"))
    return names_of(agent.policy, params)


# --------------------------------------------------------------------------- messages


def mentions_shape(message: str, shape: Sequence[int]) -> bool:
    """Whether ``message`` names ``shape`` as ``[a, b]``, ``(a, b)``, ``torch.Size([a, b])``
    or ``a x b`` (spacing ignored)."""
    flat = re.sub(r"\s+", "", message)
    dims = [str(int(d)) for d in shape]
    forms = ["[" + ",".join(dims) + "]", "(" + ",".join(dims) + ")", "x".join(dims)]
    return any(f in flat for f in forms)


# -- ILQL (test_ilql.py, test_packing.py) ----------------------------------------------------------

ILQL_KW: dict[str, Any] = {"gamma": 0.9, "tau": 0.8, "cql_scale": 0.3, "awac_scale": 0.7,
                           "awac_beta": 0.5, "alpha": 0.5, "steps_for_target_q_sync": 1}  # fmt: skip


def make_ilql(full_finetune: bool = False, **overrides: Any) -> Any:
    """``rl_algos.ILQL`` on the tiny model with :data:`ILQL_KW`, its heads (and adapter) perturbed."""
    kw = agent_kwargs(beta=0.0, **{**ILQL_KW, **overrides})
    if full_finetune:
        kw.pop("lora_config")
        kw["full_finetune"] = True
    from rl_algos import ILQL

    agent = ILQL(actor_network=tiny_model(0), **kw)
    if not full_finetune:
        perturb_adapter(agent.policy, "actor", seed=1)
    with torch.no_grad():  # online heads != target heads, so the two roles are distinguishable
        gen = torch.Generator().manual_seed(7)
        for p in agent.heads.q_heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return agent


# Two routes (float32 agent vs float64 reference, micro-batches vs the whole batch) agree to
# float32 rounding: the chain to the loss runs through the 2 decoder layers, the heads' two
# linear layers (the longest sum their 2 * hidden = 128) and the loss's mean; the gradients'
# back again.
ILQL_LOSS_STAGES = LAYERS + 3
ILQL_GRAD_STAGES = 2 * ILQL_LOSS_STAGES


def reference_loss_ilql(
    policy: Any, heads: Any, batch: Batch, rewards: torch.Tensor
) -> torch.Tensor:
    """The ILQL loss from full logits and heads at every position, in float64 (the policy and
    ``heads`` float64 copies)."""
    att = attention_from(batch.ids, batch.masks)
    lp = reference_logprobs(policy, batch.ids, att, "actor")
    hidden = policy.hidden_states(batch.ids, att)[:, :-1]
    out = heads(hidden)
    if rewards.dim() == 1:  # the terminal reward sits on each row's last action
        r = torch.zeros(batch.masks.shape, dtype=torch.float64)
        for n in range(batch.n):
            last = int(batch.masks[n].nonzero().max())
            r[n, last] = float(rewards[n])
    else:
        r = rewards.double()
    kw = {k: ILQL_KW[k] for k in ("gamma", "tau", "cql_scale", "awac_scale", "awac_beta")}
    result = rl_losses.ilql_loss(lp, list(out.qs), list(out.target_qs), out.values,
                                 batch.ids[:, 1:], r, batch.masks, **kw)  # fmt: skip
    return result.loss


def param_grads(params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient in float64 (zeros where it has none)."""
    return {
        n: (torch.zeros_like(p) if p.grad is None else p.grad.detach()).double()
        for n, p in params.items()
    }


def token_rewards(batch: Batch) -> torch.Tensor:
    """Per-token rewards at some action positions (0 elsewhere)."""
    gen = torch.Generator().manual_seed(3)
    r = torch.randn(batch.masks.shape, generator=gen)
    keep = batch.masks & (torch.rand(batch.masks.shape, generator=gen) < 0.5)
    return torch.where(keep, r, torch.zeros(()))


# -- multi-turn batches (test_packing.py) --------------------------------------------------------

# Per row: the prompt, turn 0's actions, the environment's observation (not actions), turn 1's
# actions. Row 2 plays one turn only, so micro-batches of some rows hold fewer turns than the
# batch.
MULTI_TURN: tuple[tuple[tuple[int, ...], ...], ...] = (
    ((BOS_ID, 10, 11), (30, 31), (5, 6), (32, EOS_ID)),
    ((BOS_ID, 10, 11), (33,), (5, 6), (34, 35, 36)),
    ((BOS_ID, 10, 11), (37, 38, 39), (), ()),
    ((BOS_ID, 20), (40, 41), (7,), (42,)),
    ((BOS_ID, 20), (43,), (7,), (44, 45, 46, EOS_ID)),
    ((BOS_ID, 20), (47, 48), (7,), (49,)),
)
#: [N, K = 2] per-turn rewards (row 2's second turn does not exist).
MULTI_TURN_REWARDS = ((0.5, 1.0), (0.0, 0.25), (1.0, 0.0), (0.2, -0.5), (0.0, 2.0), (1.0, 0.7))


def multi_turn_batch(
    width: int = SEQ_LEN,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [N, L], masks [N, L - 1], rewards [N, K], turn_ids [N, L - 1])`` of
    :data:`MULTI_TURN`, right-padded; ``turn_ids`` is -1 off the action tokens."""
    n = len(MULTI_TURN)
    ids = torch.full((n, width), PAD_ID, dtype=torch.long)
    masks = torch.zeros((n, width - 1), dtype=torch.bool)
    turn_ids = torch.full((n, width - 1), -1, dtype=torch.long)
    for row, (prompt, first, observation, second) in enumerate(MULTI_TURN):
        seq = [*prompt, *first, *observation, *second]
        ids[row, : len(seq)] = torch.tensor(seq)
        start = len(prompt) - 1
        for turn, actions in ((0, first), (1, second)):
            masks[row, start : start + len(actions)] = True
            turn_ids[row, start : start + len(actions)] = turn
            start += len(actions) + len(observation)
    return ids, masks, torch.tensor(MULTI_TURN_REWARDS), turn_ids
