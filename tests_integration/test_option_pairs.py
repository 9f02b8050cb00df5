"""Every numerically neutral option, alone and in pairs, gives the plain path's update (issue 37).

A *neutral* option changes how ``learn()`` computes, not what: gradient checkpointing, padded
forwards instead of packed ones (packing is the default), micro-batches by rows or by tokens,
the fused (Liger-style) loss, activation offload, the fused head's chunk rows, each row
computing its own prompt (``share_prompt_prefix=False``; the default shares a group's). On each
*base*
(an agent and the options that change what runs: GRPO, GSPO and every preset of the GRPO
family (DAPO, CISPO, Dr. GRPO, RLOO, REINFORCE++), REINFORCE,
PPO with a critic adapter or a shared value head, ILQL; a KL term with a reference adapter,
``update_epochs > 1``, full fine-tuning, the base model as reference, sampling log-probs with
the mismatch correction or with ``clip_against_sampler``; a mixture-of-experts model, LoRA and
full fine-tuning, and routing replay over two epochs), one ``learn()`` on a ragged batch
with a neutral option or a pair of them must give the base's loss and every trainable gradient
(the last optimizer step's, accumulated over the micro-batches), in float32, or the agent must
refuse the pair when it is built, with an error that names the option and what it conflicts
with (:data:`REFUSED`).

Each base runs every neutral option alone and paired with gradient checkpointing (the option
whose recomputation replays the state the others switch); the GRPO and PPO bases run every
pair. One tiny Qwen2 (two layers) and one tiny Qwen3-MoE (two layers of 4 experts, 2 routed per
token) are built per module; each agent gets a deep copy.

Tolerance: the routes sum the same terms in other orders (packed against padded rows,
micro-batches against one batch, the fused loss), so they agree to float32 rounding:
``rl_testing.tolerance`` with the longest sum the MLP's intermediate size (128, longer than
the batch's tokens, the hidden size 64 and the vocabulary), the loss four chained reductions
deep (two layers, the head, the loss's mean) and a gradient twice that (forward and backward).
A gradient that is exactly zero on the base (a critic ``lora_A`` whose ``lora_B`` is zero) must
be exactly zero on every route.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from rl_algos.presets import get_preset
from rl_testing.tolerance import assert_close

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
GROUP_SIZE = 3
REDUCTION = 128  # the MLP's intermediate size: the longest sum behind one value
LOSS_STAGES = 4  # two decoder layers, the head with its log-softmax, the loss's mean
GRAD_STAGES = 2 * LOSS_STAGES
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = LINEAR[:4]  # the MoE model's linear layers (its experts are 3-D parameters)

# (prompt, completion) per row, L = 12: a row of one token without action, a full-width row,
# a prompt without completion, lengths from 1 to 12; rows 1-2 and 4-5 repeat a prompt (what
# share_prompt_prefix shares), and ILQL's rows (those with a completion) keep rows 1-2
RAGGED: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((BOS_ID,), ()),
    ((BOS_ID, 10), (11, 30, EOS_ID)),
    ((BOS_ID, 10), (31, 32, 33, 34, 35, 36, 37, 38, 39, EOS_ID)),
    ((BOS_ID, 20, 21, 22), (40,)),
    ((BOS_ID, 20), ()),
    ((BOS_ID, 20), (21, 41, 42, 43, 44, 45)),
)
REWARDS = (1.0, 0.25, -0.5, 2.0, 0.0, 0.75)
WIDTH = 12

#: Neutral options: name -> the agent keywords that turn it on.
NEUTRAL: dict[str, dict[str, Any]] = {
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "padded": {"use_sequence_packing": False},
    "micro_batch_rows": {"micro_batch_size_per_gpu": 2},
    "micro_batch_tokens": {"micro_batch_tokens": 14},
    "use_liger_loss": {"use_liger_loss": True},
    "activation_offload": {"activation_offload": True},
    "fused_logprobs_chunk_rows": {"fused_logprobs_chunk_rows": 3},
    # the default shares the ragged rows' repeated prompts: each row computes its own instead
    "unshared_prompts": {"share_prompt_prefix": False},
}

COMMON: dict[str, Any] = {
    "pad_token_id": PAD_ID,
    "pad_token": "<pad>",
    "batch_size": 8,  # >= N: one minibatch, one optimizer step per epoch
    "beta": 0.05,  # a KL term against the reference (adapter) unless the base says otherwise
    "lr": 1e-3,
    "max_grad_norm": None,  # .grad is the raw gradient of the loss
    "update_epochs": 1,
    "temperature": 0.7,
    "device": "cpu",
    "seed": 42,
}


@dataclass(frozen=True)
class Base:
    """An agent class, its options, and what ``learn()`` receives."""

    agent: str
    options: dict[str, Any] = field(default_factory=dict)
    sampler: bool = False
    """Pass the sampling log-probs (the actor's, perturbed) to ``learn()``."""
    all_pairs: bool = False
    """Run every pair of neutral options, not only the pairs with checkpointing."""
    moe: bool = False
    """On the tiny Qwen3-MoE instead of the Qwen2: the router picks each token's experts
    again in every forward (packed, padded, shared, recomputed) and must pick the same."""

    @property
    def lora(self) -> bool:
        return not self.options.get("full_finetune", False)


BASES: dict[str, Base] = {
    "grpo-kl": Base("GRPO", {"group_size": GROUP_SIZE}, all_pairs=True),
    "gspo": Base("GSPO", {"group_size": GROUP_SIZE}),
    # the DAPO preset's defaults (clip-higher, token mean, dynamic sampling, no KL)
    "dapo": Base("GRPO", get_preset("dapo").resolve({"group_size": GROUP_SIZE})),
    # the other presets of the GRPO family: another loss (CISPO) or advantage estimator
    **{
        name: Base(
            get_preset(name).agent.__name__, get_preset(name).resolve({"group_size": GROUP_SIZE})
        )
        for name in ("cispo", "dr_grpo", "rloo", "reinforce_pp")
    },
    "grpo-epochs2": Base("GRPO", {"group_size": GROUP_SIZE, "update_epochs": 2, "lr": 0.0}),
    "grpo-full": Base("GRPO", {"group_size": GROUP_SIZE, "full_finetune": True}),
    "grpo-base-reference": Base(
        "GRPO", {"group_size": GROUP_SIZE, "use_separate_reference_adapter": False}
    ),
    "grpo-sampler": Base("GRPO", {"group_size": GROUP_SIZE}, sampler=True),
    "grpo-clip-sampler": Base(
        "GRPO", {"group_size": GROUP_SIZE, "clip_against_sampler": True}, sampler=True
    ),
    "reinforce": Base("LLMREINFORCE"),
    "ppo-critic-adapter": Base("LLMPPO", {"whiten_advantages": False}, all_pairs=True),
    "ppo-shared-head": Base("LLMPPO", {"critic_mode": "shared", "whiten_advantages": False}),
    "ilql": Base("ILQL", {"beta": 0.0}),
    # LoRA on the attention (the experts are 3-D parameters, no Linear modules), and full
    # fine-tuning, where the experts and the router train; the load-balancing loss per
    # sequence, weighted 1 (its gradient as large as the policy's) or the config's 0.001; and
    # PPO, whose critic forwards must not add to it
    "grpo-moe": Base(
        "GRPO", {"group_size": GROUP_SIZE, "router_aux_loss_coef": 1.0}, all_pairs=True, moe=True
    ),
    "grpo-moe-full": Base("GRPO", {"group_size": GROUP_SIZE, "full_finetune": True}, moe=True),
    "ppo-moe": Base("LLMPPO", {"whiten_advantages": False, "router_aux_loss_coef": 1.0}, moe=True),
    # routing replay: the second epoch's forwards force the first epoch's old-forward routes,
    # recorded and replayed in whatever layout each forward has
    "grpo-moe-r2": Base(
        "GRPO",
        {
            "group_size": GROUP_SIZE,
            "full_finetune": True,
            "update_epochs": 2,
            "router_replay": "R2",
        },
        moe=True,
    ),
}

#: (base, neutral option) -> the words its construction error must contain: the option and the
#: setting of the base it conflicts with. Every combination holding the option is refused.
REFUSED: dict[tuple[str, str], tuple[str, ...]] = {
    # the fused loss covers token-level objectives only; GSPO's ratio is per sequence
    ("gspo", "use_liger_loss"): ("use_liger_loss=True", "loss_type='gspo'"),
    # ILQL's loss is no policy loss: the fused one has nothing to fuse
    ("ilql", "use_liger_loss"): ("use_liger_loss", "ILQL"),
}


def refusal(base_name: str, combo: tuple[str, ...]) -> tuple[str, ...] | None:
    """The words the error refusing ``combo`` on the base must contain (None: not refused)."""
    for option in combo:
        words = REFUSED.get((base_name, option))
        if words is not None:
            return words
    return None


def combinations(base: Base) -> Iterator[tuple[str, ...]]:
    """The option sets ``base`` runs: each option alone, then the pairs."""
    names = list(NEUTRAL)
    yield from ((n,) for n in names)
    for pair in itertools.combinations(names, 2):
        if base.all_pairs or "gradient_checkpointing" in pair:
            yield pair


CASES = [
    pytest.param(b, combo, id=f"{b}-{'+'.join(combo)}")
    for b, base in BASES.items()
    for combo in combinations(base)
]


# --------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class Update:
    """What one ``learn()`` left: its loss and the gradient of every trainable parameter."""

    loss: float
    grads: dict[str, torch.Tensor]


def _batch(agent_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [r for r in RAGGED if r[1]] if agent_name == "ILQL" else list(RAGGED)
    ids = torch.full((len(rows), WIDTH), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), WIDTH - 1), dtype=torch.bool)
    for n, (prompt, completion) in enumerate(rows):
        seq = [*prompt, *completion]
        ids[n, : len(seq)] = torch.tensor(seq)
        mask[n, len(prompt) - 1 : len(seq) - 1] = True
    if agent_name == "ILQL":  # per-token rewards at some action positions
        gen = torch.Generator().manual_seed(3)
        r = torch.randn(mask.shape, generator=gen)
        keep = mask & (torch.rand(mask.shape, generator=gen) < 0.5)
        return ids, mask, torch.where(keep, r, torch.zeros(()))
    return ids, mask, torch.tensor(REWARDS)


@torch.no_grad()
def _perturb(agent: Any) -> None:
    """Seeded noise on the actor's ``lora_B`` (zero at init: the actor then differs from the
    reference and both LoRA factors get gradients); ILQL's online Q heads leave the targets."""
    gen = torch.Generator().manual_seed(1)
    for name, p in sorted(agent.policy.named_parameters(), key=lambda kv: kv[0]):
        if ".actor." in name and ".lora_B." in name:
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    heads = getattr(agent, "heads", None)
    if heads is not None:
        for p in heads.q_heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def _build(model: torch.nn.Module, base: Base, extra: dict[str, Any]) -> Any:
    import rl_algos
    from peft import LoraConfig

    kw = {**COMMON, **base.options, **extra}
    if base.lora:
        kw["lora_config"] = LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=ATTENTION if base.moe else LINEAR
        )
    agent = getattr(rl_algos, base.agent)(actor_network=copy.deepcopy(model), **kw)
    _perturb(agent)
    return agent


def _names(agent: Any) -> dict[int, str]:
    named = dict(agent.policy.named_parameters())
    heads = getattr(agent, "heads", None)
    if heads is not None:
        named |= {f"heads.{n}": p for n, p in heads.named_parameters()}
    return {id(p): n for n, p in named.items()}


def _learn(agent: Any, base: Base, sampling: torch.Tensor | None) -> Update:
    ids, mask, rewards = _batch(base.agent)
    kw = {"sampling_logps": sampling.clone()} if base.sampler and sampling is not None else {}
    metrics = agent.learn((ids, mask, rewards), **kw)
    names = _names(agent)
    grads = {}
    for p in agent.learner.trainable():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[names[id(p)]] = g.detach().clone()
    return Update(float(metrics["loss"]), grads)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """The tiny Qwen2 (hidden 64, 2 layers, SDPA), built once; agents take deep copies."""
    from rl_testing.models import tiny_causal_lm

    built, _ = tiny_causal_lm("qwen2", seed=0)
    return built


@pytest.fixture(scope="module")
def moe_model() -> torch.nn.Module:
    """The tiny Qwen3-MoE (hidden 64, 2 layers of 4 experts, 2 per token), built once."""
    from rl_testing.models import tiny_causal_lm

    built, _ = tiny_causal_lm("qwen3_moe", seed=0)
    return built


@pytest.fixture(scope="module")
def sampling(model: torch.nn.Module) -> torch.Tensor:
    """[N, T] sampling log-probs: the actor's at the action positions, moved by up to 0.05
    (a sampler that disagrees a little: the correction weights and the ratio move off 1)."""
    from rl_algos import parse_experiences

    agent = _build(model, BASES["grpo-sampler"], {})
    batch = parse_experiences(_batch("GRPO"), pad_token_id=PAD_ID)
    with torch.no_grad():
        lp = agent.scorer.logprobs(batch.input_ids, batch.attention_mask, batch.mask)
    wiggle = 0.05 * torch.sin(torch.arange(lp.numel(), dtype=torch.float32)).view_as(lp)
    return torch.where(batch.mask, lp + wiggle, torch.zeros(()))


@pytest.fixture(scope="module")
def plain(
    model: torch.nn.Module, moe_model: torch.nn.Module, sampling: torch.Tensor
) -> Callable[[str], Update]:
    """The base's own update (no neutral option), computed once per base."""
    done: dict[str, Update] = {}

    def get(name: str) -> Update:
        if name not in done:
            base = BASES[name]
            built = _build(moe_model if base.moe else model, base, {})
            done[name] = _learn(built, base, sampling)
        return done[name]

    return get


def _options(combo: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in combo:
        out.update(NEUTRAL[name])
    return out


def _assert_same_update(actual: Update, expected: Update, where: str) -> None:
    assert math.isfinite(expected.loss), where
    assert_close(
        torch.tensor(actual.loss, dtype=torch.float64),
        torch.tensor(expected.loss, dtype=torch.float64),
        reduction=REDUCTION,
        stages=LOSS_STAGES,
        scale=max(1.0, abs(expected.loss)),  # the loss cancels terms of the advantages' size
        dtype=torch.float32,
        msg=f"{where}: loss",
    )
    assert set(actual.grads) == set(expected.grads), where
    assert any(bool(g.any()) for g in expected.grads.values()), f"{where}: no gradient at all"
    for name, e in expected.grads.items():
        a = actual.grads[name]
        if not bool(e.any()):  # structurally zero (a critic lora_A with lora_B = 0)
            assert not bool(a.any()), f"{where}: {name} must get no gradient"
            continue
        assert_close(
            a,
            e,
            reduction=REDUCTION,
            stages=GRAD_STAGES,
            dtype=torch.float32,
            msg=f"{where}: grad {name}",
        )


@pytest.fixture
def recomputations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per checkpointed recomputation (``rl_adapters.replay``'s replay context)."""
    from rl_adapters import replay

    seen: list[int] = []
    enter = replay._Replay.__enter__

    def counted(self: Any) -> None:
        seen.append(len(self.switches))
        enter(self)

    monkeypatch.setattr(replay._Replay, "__enter__", counted)
    return seen


@pytest.mark.parametrize(("base_name", "combo"), CASES)
def test_neutral_options_give_the_plain_update(
    base_name: str,
    combo: tuple[str, ...],
    model: torch.nn.Module,
    moe_model: torch.nn.Module,
    sampling: torch.Tensor,
    plain: Callable[[str], Update],
    recomputations: list[int],
) -> None:
    base = BASES[base_name]
    if base.moe:
        model = moe_model
    refused = refusal(base_name, combo)
    if refused is not None:
        pattern = ".*".join(re.escape(word) for word in refused)
        with pytest.raises(ValueError, match=pattern):
            _build(model, base, _options(combo))
        return
    expected = plain(base_name)
    recomputations.clear()
    agent = _build(model, base, _options(combo))
    _assert_same_update(_learn(agent, base, sampling), expected, f"{base_name} + {combo}")
    # checkpointing really recomputed the layers in the backward (and only with it), each time
    # inside the switches of the forward (at least the checkpointing flags)
    if "gradient_checkpointing" in combo:
        assert recomputations and min(recomputations) >= 1
    else:
        assert not recomputations
    # the shared-prompt forwards ran unless the option or padded forwards turn them off; the
    # token budget (14) keeps rows 4-5 (10 tokens) together but not rows 1-2 (17), ILQL's only
    # pair that shares
    off = "unshared_prompts" in combo or "padded" in combo
    budget_cuts = "micro_batch_tokens" in combo and base.agent == "ILQL"
    assert (agent.packing_report.shared_forwards > 0) == (not off and not budget_cuts)


def test_the_matrix_covers_every_base_and_option() -> None:
    """The size of the matrix (reported in the issue's closing note)."""
    run = [(b, c) for b, base in BASES.items() for c in combinations(base)]
    refused = [key for key in run if refusal(*key) is not None]
    assert len(BASES) == 20 and len(NEUTRAL) == 8
    assert len(run) == 3 * (8 + 28) + 17 * (8 + 7)  # 363
    assert len(refused) == 4  # the fused loss on GSPO and ILQL, alone and with checkpointing
