"""The load-balancing loss of a mixture-of-experts policy against transformers' own.

transformers computes it (``load_balancing_loss_func``, the ``aux_loss`` of an MoE model's
forward with ``output_router_logits=True``) over the tokens of one forward; rl-algos over each
sequence (``rl_algos.router_balance``), so the two agree row by row. The option matrix
(``tests_integration/test_option_pairs.py``) checks that packing, shared prompts,
micro-batches, checkpointing, offload and the fused loss leave it unchanged.
"""

from __future__ import annotations

import copy

import pytest
import torch
from rl_algos import GRPO, ILQL
from rl_algos.router_balance import router_module_class, sequence_balance_loss
from rl_testing.devices import DEVICES
from rl_testing.models import tiny_causal_lm
from rl_testing.tolerance import assert_close
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

#: Rows of ids (BOS 1, EOS 2, pad 0): lengths 7, 4 and 9 of width 9; an action from token 3.
ROWS = ((1, 11, 12, 13, 14, 15, 2), (1, 21, 22, 2), (1, 31, 32, 33, 34, 35, 36, 37, 2))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(ROWS), 9, dtype=torch.long)
    mask = torch.zeros(len(ROWS), 8, dtype=torch.bool)
    for n, row in enumerate(ROWS):
        ids[n, : len(row)] = torch.tensor(row)
        mask[n, 2 : len(row) - 1] = True
    return ids, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_row_is_transformers_load_balancing_loss_of_that_row(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    N, L, Y, E, k = 3, 6, 2, 5, 2
    logits = torch.randn(N, L, Y, E, generator=g, dtype=torch.float64)
    lengths = [6, 3, 1]
    attention = torch.arange(L)[None] < torch.tensor(lengths)[:, None]
    ours = sequence_balance_loss(logits, attention, k)
    for n, length in enumerate(lengths):
        per_layer = tuple(logits[n, :length, y] for y in range(Y))  # [L_r, E] per layer
        theirs = load_balancing_loss_func(per_layer, E, k, None)
        assert_close(ours[n], theirs.to(torch.float64), reduction=L * Y, dtype=torch.float32)
    # a uniform router: every expert's share is k / E and its probability 1 / E: the loss is k
    flat = sequence_balance_loss(torch.zeros(1, 4, Y, E), torch.ones(1, 4, dtype=torch.bool), k)
    assert_close(flat, torch.tensor([float(k)]), reduction=4 * Y)


def _moe(family: str) -> torch.nn.Module:
    """A tiny random MoE model of ``family`` (2 layers of 4 experts, 2 per token), float32."""
    if family == "qwen3_moe":
        return tiny_causal_lm("qwen3_moe", seed=0)[0]
    import transformers

    size = {
        "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "num_experts_per_tok": 2,
    }  # fmt: skip
    experts = {
        "mixtral": {"num_local_experts": 4},
        "olmoe": {"num_experts": 4},
        # with a shared expert beside the routed ones
        "qwen2_moe": {"num_experts": 4, "moe_intermediate_size": 32,
                      "shared_expert_intermediate_size": 32},
    }[family]  # fmt: skip
    name = {"mixtral": "Mixtral", "olmoe": "Olmoe", "qwen2_moe": "Qwen2Moe"}[family]
    config = getattr(transformers, f"{name}Config")(**size, **experts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model: torch.nn.Module = getattr(transformers, f"{name}ForCausalLM")(config)
    return model.float().eval()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe"])
def test_the_update_adds_transformers_aux_loss_of_each_row_with_its_gradient(
    family: str, device: str
) -> None:
    """Advantages 0 (equal rewards) leave the balance loss alone in the update: the gradient of
    every weight (experts and router included, full fine-tuning) is ``coef`` times the mean over
    the rows of the gradient of the model's own ``aux_loss`` on each row alone (on the CPU)."""
    model = _moe(family)
    reference = copy.deepcopy(model)
    coef = 0.5
    agent = GRPO(
        actor_network=model, pad_token_id=0, pad_token="<pad>", group_size=3, batch_size=3,
        full_finetune=True, beta=0.0, lr=0.0, max_grad_norm=None, router_aux_loss_coef=coef,
        device=device,
    )  # fmt: skip
    ids, mask = _batch()
    metrics = agent.learn((ids, mask, torch.ones(3)))
    total = torch.zeros(())
    values = []
    for row in ROWS:
        out = reference(torch.tensor([row]), output_router_logits=True)
        values.append(float(out.aux_loss.detach()))
        total = total + out.aux_loss
    (coef * total / len(ROWS)).backward()
    assert_close(
        torch.tensor(metrics["aux_loss"]), torch.tensor(sum(values) / 3), reduction=9 * 2 * 4
    )
    theirs = dict(reference.named_parameters())
    checked = 0
    for name, p in agent.policy.causal_lm.named_parameters():
        expected = theirs[name].grad
        if expected is None or not bool(expected.any()):
            assert p.grad is None or not bool(p.grad.any()), name  # no aux gradient there
            continue
        assert p.grad is not None and p.grad.device.type == torch.device(device).type, name
        assert_close(p.grad.cpu(), expected, reduction=128, stages=8, msg=name)
        checked += 1
    assert checked >= 2 * 6  # every layer's router, experts, attention and norms


def test_none_takes_the_model_config_and_a_dense_model_or_ilql_refuses_a_weight() -> None:
    moe, _ = tiny_causal_lm("qwen3_moe", seed=0, router_aux_loss_coef=0.25)
    agent = GRPO(actor_network=moe, pad_token_id=0, pad_token="<pad>", group_size=2)
    assert agent.router_balance is not None and agent.router_balance.coef == 0.25
    assert router_module_class(moe) is not None
    fresh, _ = tiny_causal_lm("qwen3_moe", seed=0)  # the agent above wrapped `moe` in LoRA
    off = GRPO(actor_network=fresh, pad_token_id=0, pad_token="<pad>", group_size=2,
               router_aux_loss_coef=0.0)  # fmt: skip
    assert off.router_balance is None
    dense, _ = tiny_causal_lm("qwen2", seed=0)
    assert router_module_class(dense) is None
    agent = GRPO(actor_network=dense, pad_token_id=0, pad_token="<pad>", group_size=2)
    assert agent.router_balance is None
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.1\): Qwen2ForCausalLM is not a"):
        GRPO(actor_network=tiny_causal_lm("qwen2")[0], pad_token_id=0, pad_token="<pad>",
             group_size=2, router_aux_loss_coef=0.1)  # fmt: skip
    with pytest.raises(ValueError, match=r"`router_aux_loss_coef` must be None .* got -1"):
        GRPO(actor_network=tiny_causal_lm("qwen2")[0], pad_token_id=0, pad_token="<pad>",
             group_size=2, router_aux_loss_coef=-1.0)  # fmt: skip
    with pytest.raises(ValueError, match=r"ILQL\(router_aux_loss_coef=0.5\)"):
        ILQL(actor_network=tiny_causal_lm("qwen3_moe")[0], pad_token_id=0, pad_token="<pad>",
             router_aux_loss_coef=0.5)  # fmt: skip


def test_gradient_checkpointing_switches_to_the_checkpoint_that_keeps_router_gradients() -> None:
    moe, _ = tiny_causal_lm("qwen3_moe", seed=0)
    on = GRPO(actor_network=moe, pad_token_id=0, pad_token="<pad>", group_size=2,
              gradient_checkpointing=True)  # fmt: skip
    assert on.policy.causal_lm._rl_checkpoint == "non-reentrant"
    dense, _ = tiny_causal_lm("qwen2", seed=0)
    plain = GRPO(actor_network=dense, pad_token_id=0, pad_token="<pad>", group_size=2,
                 gradient_checkpointing=True)  # fmt: skip
    assert plain.policy.causal_lm._rl_checkpoint == "reentrant"


def test_a_clone_records_its_own_routers() -> None:
    moe, _ = tiny_causal_lm("qwen3_moe", seed=0)
    agent = GRPO(actor_network=moe, pad_token_id=0, pad_token="<pad>", group_size=3,
                 batch_size=3, router_aux_loss_coef=1.0)  # fmt: skip
    twin = agent.clone()
    assert twin.router_balance is not None and twin.router_balance is not agent.router_balance
    ids, mask = _batch()
    assert twin.learn((ids, mask, torch.tensor([1.0, 0.0, 0.5])))["aux_loss"] > 0


def test_zero3_checkpointing_of_experts_is_refused_below_the_deepspeed_that_gathers_them() -> None:
    """DeepSpeed 0.16.4 to 0.19.2 recompute a checkpointed mixture-of-experts layer under ZeRO-3
    with its weights still partitioned (tests_integration/test_deepspeed.py at the floor):
    such an agent is refused when built, naming the option, the stage and both versions."""
    from rl_algos.grpo import GRPOConfig
    from rl_algos.refusals import DEEPSPEED_ZERO3_MOE_CHECKPOINTING, refuse_with_deepspeed

    moe, dense = _moe("qwen3_moe"), tiny_causal_lm("qwen2", seed=0)[0]
    checkpointed, plain = GRPOConfig(gradient_checkpointing=True), GRPOConfig()
    assert DEEPSPEED_ZERO3_MOE_CHECKPOINTING == "0.19.3"
    with pytest.raises(ValueError, match=r"gradient_checkpointing=True on a mixture of experts "
                       r"\(Qwen3MoeForCausalLM\) under DeepSpeed ZeRO-3 needs deepspeed>=0\.19\.3 "
                       r"\(installed: 0\.19\.2\)"):  # fmt: skip
        refuse_with_deepspeed(checkpointed, moe, 3, "0.19.2")
    with pytest.raises(ValueError, match=r"installed: 0\.16\.4\b"):
        refuse_with_deepspeed(checkpointed, moe, 3, "0.16.4")
    refuse_with_deepspeed(checkpointed, moe, 3, "0.19.3")  # the release that gathers them
    refuse_with_deepspeed(checkpointed, moe, 3, "0.20.0rc1")
    refuse_with_deepspeed(checkpointed, moe, 2, "0.16.4")  # ZeRO-2 does not partition weights
    refuse_with_deepspeed(plain, moe, 3, "0.16.4")  # nothing is recomputed
    refuse_with_deepspeed(checkpointed, dense, 3, "0.16.4")  # a dense model recomputes fine
    refuse_with_deepspeed(checkpointed, moe, 0)  # no DeepSpeed: its version is never read
