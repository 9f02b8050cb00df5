"""Routing replay (R2) of a mixture-of-experts policy: recorded, forced, recomputed.

The routes recorded in the old-log-prob forward are each model's own top-k (transformers'
router logits), in every layout; a replayed forward after the weights moved equals the model
with its routers' choice overwritten by hand (the recorded experts, their current scores); a
checkpointed recomputation replays them too; models whose routers cannot be replayed, and
settings that cannot serve it, are refused when the agent is built. The option matrix
(``tests_integration/test_option_pairs.py``, base ``grpo-moe-r2``) runs it with every neutral
option.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from rl_algos import GRPO, ILQL, LLMPPO, parse_experiences
from rl_algos.router_balance import sequence_balance_loss
from rl_algos.router_replay import laid_out
from rl_algos.scoring import score_batch
from rl_algos.server_sync import use_server
from rl_rollout import HFEngine, RolloutServer
from rl_testing.models import tiny_causal_lm
from rl_testing.routing import assert_own_top_k, tie_gap
from rl_testing.tolerance import assert_close
from test_router_balance import ROWS, _batch, _moe

FAMILIES = ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe"]


def _agent(model: torch.nn.Module, **options: Any) -> GRPO:
    settings: dict[str, Any] = {
        "actor_network": model, "pad_token_id": 0, "pad_token": "<pad>", "group_size": 3,
        "batch_size": 3, "full_finetune": True, "beta": 0.0, "router_aux_loss_coef": 0.0,
        "router_replay": "R2",
    }  # fmt: skip
    return GRPO(**{**settings, **options})


def _router_weights(model: torch.nn.Module) -> set[str]:
    """Names of the router modules' weights."""
    return {
        f"{name}.weight"
        for name, m in model.named_modules()
        if type(m).__name__.endswith("TopKRouter")
    }


def _move_routers(model: torch.nn.Module) -> None:
    """Add noise to the routers' weights (seeded), enough that many tokens choose again."""
    routers = _router_weights(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in routers:
                p.add_(3.0 * torch.randn(p.shape, generator=g))


def _parsed() -> Any:
    ids, mask = _batch()
    return parse_experiences((ids, mask, torch.tensor([1.0, 0.0, 0.5])), pad_token_id=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "options",
    [{"use_sequence_packing": False}, {"use_sequence_packing": True}, {"micro_batch_tokens": 10}],
    ids=["padded", "packed", "token-budget"],
)
def test_recorded_routes_are_the_models_own_top_k_per_token(
    family: str, options: dict[str, Any]
) -> None:
    """In every layout, and with the rows scored in several forwards of a token budget."""
    model = _moe(family)
    reference = copy.deepcopy(model)
    agent = _agent(model, **options)
    batch = _parsed()
    routes = score_batch(agent.scorer, batch, with_reference=False).routes
    assert routes is not None and routes.shape == (3, 9, 2, 2) and routes.dtype == torch.int16
    real = batch.attention_mask.bool()
    assert bool((routes[~real] == -1).all())
    # each row alone, as transformers routes it; the layouts round differently, so a token
    # whose 2nd and 3rd expert nearly tie may go either way, the others must agree
    outs = [reference(torch.tensor([row]), output_router_logits=True) for row in ROWS]
    logits = [torch.cat([out.router_logits[y] for out in outs]) for y in range(2)]
    ours = torch.cat([routes[n, : len(row)] for n, row in enumerate(ROWS)])
    assert_own_top_k(ours, logits, gap=tie_gap(model.config.hidden_size, 2))


def _forced_reference(model: torch.nn.Module, routes: torch.Tensor) -> list[Any]:
    """Hooks that overwrite each router's choice of ``model`` by ``routes`` [N * L, Y, k]: the
    recorded experts, with the softmax of the router's logits there (its input times its
    weight; normalised over the k, as these families do), independently of rl_algos' mechanism
    and of what the router returns (its first output is the logits in transformers 5.23, their
    softmax in 5.0)."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = []
    for y, router in enumerate(routers):

        def hook(module: Any, args: Any, output: Any, y: int = y) -> Any:
            hidden = args[0].reshape(-1, module.weight.shape[1])
            logits = torch.nn.functional.linear(hidden, module.weight)
            chosen = routes[:, y].long()
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
            if getattr(module, "norm_topk_prob", True):
                probs = probs / probs.sum(-1, keepdim=True)
            return output[0], probs.to(output[1].dtype), chosen

        handles.append(router.register_forward_hook(hook))
    return handles


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_a_replayed_forward_is_the_model_with_the_recorded_experts_forced(family: str) -> None:
    """After the routers move, the replayed forward (values and every gradient) equals the model
    whose routers' choice is overwritten with the recorded experts by hand, and not the model
    that routes afresh (the routes flipped)."""
    model = _moe(family)
    agent = _agent(model)
    batch = _parsed()
    routes = score_batch(agent.scorer, batch, with_reference=False).routes
    assert routes is not None
    flat = routes.view(-1, *routes.shape[2:])
    causal = agent.policy.causal_lm
    _move_routers(causal)  # tokens would now choose other experts
    forced = copy.deepcopy(causal).eval()
    fresh = copy.deepcopy(causal).eval()
    ids, attn = batch.input_ids, batch.attention_mask
    replay = agent.router_replayer
    assert replay is not None
    with replay.replaying(routes), laid_out(replay, torch.arange(ids.numel())):
        ours = causal(ids, attention_mask=attn).logits
    assert replay.flips() is not None and replay.flips() > 0.2  # type: ignore[operator]
    real = attn.bool()
    # where nothing was recorded (padding) the reference keeps the live choice: compare reals
    handles = _forced_reference(forced, torch.where(flat >= 0, flat, 0))
    theirs = forced(ids, attention_mask=attn).logits
    for h in handles:
        h.remove()
    afresh = fresh(ids, attention_mask=attn).logits
    assert_close(ours[real], theirs[real], reduction=128, stages=4)
    assert (
        float((ours[real] - afresh[real]).detach().abs().max()) > 1e-3
    )  # replay changed the result
    (ours[real].sum()).backward()
    (theirs[real].sum()).backward()
    named = dict(forced.named_parameters())
    checked = 0
    for name, p in causal.named_parameters():
        expected = named[name].grad
        assert p.grad is not None and expected is not None, name
        assert_close(p.grad, expected, reduction=128, stages=8, msg=name)
        checked += name in _router_weights(causal) and bool(p.grad.any())
    assert checked == 2  # both routers got their gradient through the forced scores


def _replayed_grads(**options: Any) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients of the actor's log-probs replaying the routes of the unmoved model after the
    routers moved, and the fraction of flipped routes."""
    model, _ = tiny_causal_lm("qwen3_moe", seed=0)
    agent = _agent(model, **options)
    batch = _parsed()
    routes = score_batch(agent.scorer, batch, with_reference=False).routes
    assert routes is not None
    _move_routers(agent.policy.causal_lm)
    replay = agent.router_replayer
    assert replay is not None
    with replay.replaying(routes):
        lp = agent.scorer.logprobs(batch.input_ids, batch.attention_mask, batch.mask)
        lp.sum().backward()
    flips = replay.flips()
    assert flips is not None
    grads = {
        n: p.grad.clone()
        for n, p in agent.policy.causal_lm.named_parameters()
        if p.grad is not None
    }
    return grads, flips


def test_every_layout_and_checkpointed_recomputation_replays_the_same_routes() -> None:
    """Padded, packed, and recomputed by either checkpoint: one replayed gradient."""
    expected, flips = _replayed_grads(use_sequence_packing=False)
    assert flips > 0.2
    for options in (
        {"use_sequence_packing": True},
        {"gradient_checkpointing": True},  # the reentrant checkpoint
        {"gradient_checkpointing": True, "router_aux_loss_coef": 1.0},  # the non-reentrant one
        {"gradient_checkpointing": True, "use_sequence_packing": True},
    ):
        grads, other = _replayed_grads(**options)
        assert other == flips, options
        assert set(grads) == set(expected)
        for name, e in expected.items():
            assert_close(grads[name], e, reduction=128, stages=8, msg=f"{options}: {name}")


def test_the_update_replays_the_old_forwards_routes() -> None:
    """With a second epoch, the update reports the routes that would have flipped; on-policy
    (one step, no old forward) there is nothing to replay."""
    model, _ = tiny_causal_lm("qwen3_moe", seed=0)
    ids, mask = _batch()
    rewards = torch.tensor([1.0, 0.0, 0.5])
    agent = _agent(model, update_epochs=3, batch_size=2, lr=0.05)
    metrics = agent.learn((ids, mask, rewards))
    assert metrics["route_flips"] > 0
    on_policy = _agent(tiny_causal_lm("qwen3_moe", seed=0)[0])
    with pytest.warns(UserWarning, match=r"router_replay='R2' has nothing to replay in an on-"):
        assert "route_flips" not in on_policy.learn((ids, mask, rewards))
    ppo = LLMPPO(
        actor_network=tiny_causal_lm("qwen3_moe", seed=0)[0], pad_token_id=0, pad_token="<pad>",
        update_epochs=2, lr=0.05, router_replay="R2", router_aux_loss_coef=1.0,
    )  # fmt: skip
    assert ppo.learn((ids, mask, rewards))["route_flips"] > 0  # the critic forwards pass by
    twin = agent.clone()
    assert twin.router_replayer is not None and twin.router_replayer is not agent.router_replayer
    assert twin.learn((ids, mask, rewards))["route_flips"] > 0


def _deepseek_v3() -> torch.nn.Module:
    import transformers

    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=0, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.DeepseekV3ForCausalLM(config).float().eval()


def test_settings_and_models_that_cannot_replay_are_refused() -> None:
    dense, _ = tiny_causal_lm("qwen2", seed=0)
    with pytest.raises(ValueError, match=r"router_replay='R2'\): Qwen2ForCausalLM is not a"):
        _agent(dense)
    with pytest.raises(ValueError, match=r"`router_replay` must be None, 'R2' or 'R3', got 'r2'"):
        _agent(_moe("qwen3_moe"), router_replay="r2")
    with pytest.raises(ValueError, match=r"router_replay='R2'.*share_prompt_prefix=True"):
        _agent(_moe("qwen3_moe"), share_prompt_prefix=True)
    with pytest.raises(ValueError, match=r"router_replay='R2'.*clip_against_sampler=True"):
        _agent(_moe("qwen3_moe"), clip_against_sampler=True)
    with pytest.raises(ValueError, match=r"ILQL\(router_replay='R2'\)"):
        ILQL(actor_network=_moe("qwen3_moe"), pad_token_id=0, pad_token="<pad>",
             router_replay="R2")  # fmt: skip
    # DeepSeek-V3 picks expert groups first: several torch.topk calls per router forward
    # (transformers 5.0 declares no router for it: refused as such)
    with pytest.raises(ValueError, match=r"DeepseekV3(TopkRouter .*=None|ForCausalLM .*no router)"):
        _agent(_deepseek_v3())


def test_the_balance_loss_counts_the_replayed_experts() -> None:
    """``F_i`` counts the experts the forward used: the replayed ones where a token has them,
    its own top-k elsewhere (``sequence_balance_loss(routes=)``), against the formula by hand."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 3, 1, 4, generator=g, dtype=torch.float64)
    attention = torch.ones(1, 3, dtype=torch.bool)
    routes = torch.tensor([[0, 1], [0, 1], [-1, -1]], dtype=torch.int16).view(1, 3, 1, 2)
    probs = torch.softmax(logits[0, :, 0], dim=-1)  # [3, 4]
    own = torch.topk(probs[2], 2).indices.tolist()
    counts = torch.zeros(4, dtype=torch.float64)
    for experts in ([0, 1], [0, 1], own):
        counts[experts] += 1
    expected = 4 * ((counts / 3) * probs.mean(0)).sum()
    ours = sequence_balance_loss(logits, attention, 2, routes)
    assert_close(ours, expected[None].float(), reduction=12, dtype=torch.float32)  # float32 probs
    # the model's own top-k as routes is the loss without them
    live = torch.topk(torch.softmax(logits, -1), 2, dim=-1).indices.to(torch.int16)
    assert_close(
        sequence_balance_loss(logits, attention, 2, live),
        sequence_balance_loss(logits, attention, 2),
        reduction=12,
        dtype=torch.float32,
    )
    assert float((ours - sequence_balance_loss(logits, attention, 2)).abs().max()) > 1e-3


def test_the_config_keeps_the_mode_and_a_checkpoint_round_trips(tmp_path: Any) -> None:
    """The agent's replay mechanism is its own attribute: ``router_replay`` stays the config's
    string (agent attributes named like a config field write the config)."""
    agent = _agent(_moe("qwen3_moe"), update_epochs=2)
    assert agent.config.router_replay == "R2" and agent.router_replayer is not None
    path = agent.save_checkpoint(tmp_path / "ckpt")
    again = GRPO.load(path, actor_network=_moe("qwen3_moe"))
    assert again.config.router_replay == "R2" and again.router_replayer is not None
    assert again.router_replayer.mode == "R2"


PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 20, 21]]


def _r3_agent(**options: Any) -> GRPO:
    model, tok = tiny_causal_lm("qwen3_moe", seed=0)
    return _agent(
        model, tokenizer=tok, group_size=2, batch_size=6, router_replay="R3", temperature=1.0,
        max_output_tokens=6, **options,
    )  # fmt: skip


def test_r3_lays_out_the_samplers_routes_like_the_rollout() -> None:
    """``get_action``'s rollout carries the engine's routes laid out like its ``input_ids``:
    a forward of those rows routes each token as the sampler did (up to near ties)."""
    agent = _r3_agent()
    rollout = agent.get_action([{"input_ids": torch.tensor([p])} for p in PROMPTS]).rollout
    routes = rollout.sampling_routes
    assert routes is not None and routes.shape == (*rollout.input_ids.shape, 2, 2)
    model = agent.policy.causal_lm
    attention = (rollout.input_ids != 0).long()
    with torch.no_grad():
        out = model(rollout.input_ids, attention_mask=attention, output_router_logits=True)
    gap = tie_gap(model.config.hidden_size, 2)
    _, ran = assert_own_top_k(routes, out.router_logits, gap=gap)
    # every real token but each row's last one ran in a forward of the sampler
    assert ran == 2 * int(attention.sum() - attention.shape[0])


def test_r3_scores_and_updates_with_the_samplers_routes() -> None:
    """Whatever routes the rollout carries are forced: the old log-probs are the model's with
    its routers' choice overwritten by those routes (here a pattern no router would choose,
    a different pair per position and layer), not the model's own."""
    agent = _r3_agent()
    rollout = agent.get_action([{"input_ids": torch.tensor([p])} for p in PROMPTS]).rollout
    assert rollout.sampling_routes is not None
    N, L = rollout.input_ids.shape
    t = torch.arange(L)[None, :, None] + torch.arange(2)[None, None, :]  # [1, L, Y]
    pattern = torch.stack([t % 4, (t + 1) % 4], dim=-1).expand(N, L, 2, 2).to(torch.int16)
    forced_routes = torch.where(rollout.sampling_routes >= 0, pattern, -1)
    rollout = dataclasses.replace(rollout, sampling_routes=forced_routes)
    batch = agent.parse(rollout.with_rewards(torch.arange(N, dtype=torch.float32)))
    scores = score_batch(agent.scorer, batch, with_reference=False)
    real = batch.attention_mask.bool()[:, :, None, None]
    assert scores.routes is not None
    assert torch.equal(scores.routes, forced_routes.masked_fill(~real, -1))  # bit-exact: indices
    causal = agent.policy.causal_lm
    forced = copy.deepcopy(causal).eval()
    flat = forced_routes.view(-1, 2, 2)
    handles = _forced_reference(forced, torch.where(flat >= 0, flat, 0))
    with torch.no_grad():
        logits = forced(batch.input_ids, attention_mask=batch.attention_mask).logits
        own = causal(batch.input_ids, attention_mask=batch.attention_mask).logits
    for h in handles:
        h.remove()
    targets = batch.input_ids[:, 1:, None]
    theirs = logits[:, :-1].float().log_softmax(-1).gather(-1, targets)[..., 0]
    afresh = own[:, :-1].float().log_softmax(-1).gather(-1, targets)[..., 0]
    old = scores.old()
    assert_close(old[batch.mask], theirs[batch.mask], reduction=128, stages=4)
    assert float((old[batch.mask] - afresh[batch.mask]).abs().max()) > 1e-3
    metrics = agent.learn(rollout.with_rewards(torch.arange(N, dtype=torch.float32)))
    assert metrics["route_flips"] > 0.2  # the update's own choice differs from the pattern


def test_r3_needs_the_samplers_routes_and_the_hugging_face_engine() -> None:
    agent = _r3_agent()
    ids, mask = _batch()
    with pytest.raises(ValueError, match=r"router_replay='R3' replays the sampler's routes, and"):
        agent.learn((ids[:2], mask[:2], torch.tensor([1.0, 0.0])))  # a tuple: no routes
    with pytest.raises(ValueError, match=r"router_replay='R3'.*use_vllm=True"):
        _r3_agent(use_vllm=True)


def test_r3_on_a_rollout_server_gets_the_servers_routes_and_refuses_one_without() -> None:
    """``use_server``: the server's ``HFEngine(record_routes=True)`` (``rl-rollout-server
    --record-routes``) samples with the pushed weights, and its routes come back over the wire
    into the rollout, row for row the local engine's; a server that does not record them is
    refused when the agent is pointed at it, naming the flag."""
    local, served = _r3_agent(), _r3_agent()
    other, tok = tiny_causal_lm("qwen3_moe", seed=5)  # other weights: the first push replaces them
    chunk = served.config.hf_generate_chunk_size
    prompts = [{"input_ids": torch.tensor([p])} for p in PROMPTS]
    with RolloutServer(HFEngine(other, tok, prompts_per_batch=chunk, record_routes=True)) as server:
        use_server(served, server.url, timeout=60.0)
        theirs = served.get_action(prompts).rollout
    ours = local.get_action(prompts).rollout
    assert theirs.sampling_routes is not None and ours.sampling_routes is not None
    assert torch.equal(theirs.input_ids, ours.input_ids)  # bit-exact: the same sampling program
    assert torch.equal(theirs.sampling_routes, ours.sampling_routes)  # bit-exact: indices
    assert bool((theirs.sampling_routes >= 0).any())
    N = theirs.input_ids.shape[0]
    metrics = served.learn(theirs.with_rewards(torch.arange(N, dtype=torch.float32)))
    assert 0.0 <= metrics["route_flips"] <= 1.0  # learn() replayed the server's routes
    unrecorded, unrecorded_tok = tiny_causal_lm("qwen3_moe", seed=0)
    with RolloutServer(HFEngine(unrecorded, unrecorded_tok)) as server:
        with pytest.raises(ValueError, match=r"does not return them: start it with --record-rou"):
            use_server(_r3_agent(), server.url, timeout=60.0)
        use_server(_agent(tiny_causal_lm("qwen3_moe", seed=0)[0], router_replay="R2"), server.url)
