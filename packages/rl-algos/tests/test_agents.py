"""Agent behaviour beyond one learn(): generation, resume, clones, HPO hooks, the NaN guard."""

from __future__ import annotations

import copy
import functools
import math
import random

import algos_testlib as tl
import pytest
import torch
from algos_testlib import GROUP_SIZE, lora_config, make_agent, make_batch, tiny_model
from peft import LoraConfig
from rl_algos import (
    CISPO,
    GRPO,
    GSPO,
    LLMPPO,
    LLMREINFORCE,
    ActionResult,
    CosineLRScheduleConfig,
    HyperparameterConfig,
    RLParameter,
    VLLMConfig,
    dapo,
    dr_grpo,
    reinforce_pp,
    rloo,
    save_llm_checkpoint,
)
from rl_testing.models import tiny_causal_lm
from rl_testing.tolerance import assert_close


def prompts(n: int = 2) -> list[dict[str, torch.Tensor]]:
    rows = [[1, 10, 11, 12], [1, 20, 21], [1, 5, 6, 7, 8]][:n]
    return [
        {"input_ids": torch.tensor([r]), "attention_mask": torch.ones(1, len(r), dtype=torch.long)}
        for r in rows
    ]


def actor_state(agent) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    return {n: p.detach().clone() for n, p in agent.policy.named_parameters() if p.requires_grad}


def test_get_action_layout_and_sampling_logprobs_match_the_trainer() -> None:
    agent = make_agent(
        "GRPO", temperature=1.0, top_k=0, top_p=1.0, max_output_tokens=5, perturb_seed=None
    )
    result = agent.get_action(prompts())
    assert isinstance(result, ActionResult)
    comp, masks = result  # AgileRL's tuple unpacking
    assert len(comp) == len(masks) == 2
    for p, c, m in zip(prompts(), comp, masks, strict=True):
        P = p["input_ids"].shape[1]
        assert c.shape[0] == GROUP_SIZE
        assert m.shape == (GROUP_SIZE, c.shape[1] - 1)
        assert torch.equal(c[:, :P], p["input_ids"].expand(GROUP_SIZE, -1))  # bit-exact: token ids
        assert not m[:, : P - 1].any()
        assert m[:, P - 1].all()  # the first generated token is always an action
    # the sampling log-probs (temperature 1, no filtering) equal the trainer's log-probs
    batch = agent.parse((comp, masks, torch.zeros(2 * GROUP_SIZE)), None, result.sampling_logprobs)
    with torch.no_grad():
        old = agent.scorer.logprobs(batch.input_ids, batch.attention_mask, batch.mask)
    assert batch.sampling_logprobs is not None
    # Two routes (the sampler's cached decode, the trainer's full forward): float32 rounding
    # through the 2 layers and the head's log-softmax, at the scale of the log-probs.
    assert_close(
        old[batch.mask],
        batch.sampling_logprobs[batch.mask],
        reduction=tl.REDUCTION,
        stages=tl.LOSS_STAGES - 1,
        msg="sampling log-probs",
    )


def test_eval_actions_are_greedy_single_samples() -> None:
    agent = make_agent("GRPO", max_output_tokens=4, perturb_seed=None)
    a = agent.get_action(prompts(3), training=False)
    b = agent.get_action(prompts(3), training=False)
    assert [c.shape[0] for c in a.completion_ids] == [1, 1, 1]
    # bit-exact: integer token ids
    assert all(torch.equal(x, y) for x, y in zip(a.completion_ids, b.completion_ids, strict=True))


@pytest.mark.parametrize("algo", ["GRPO", "LLMREINFORCE", "LLMPPO"])
def test_save_load_continue_equals_uninterrupted(tmp_path, algo: str) -> None:  # type: ignore[no-untyped-def]
    """Shuffled minibatches (batch_size < N) and 2 epochs: optimizer, scheduler and RNG state matter."""
    batches = [make_batch(rewards=[float(k + i) % 3 for i in range(6)]) for k in range(4)]

    def learn(agent, b) -> dict[str, float]:  # type: ignore[no-untyped-def]
        return agent.learn(b.experiences())

    kw = {"batch_size": 4, "update_epochs": 2, "lr": 1e-2, "max_grad_norm": 1.0}
    a = make_agent(algo, **kw)
    for b in batches[:2]:
        learn(a, b)
    a.save_checkpoint(tmp_path / "ckpt")
    tail_a = [learn(a, b) for b in batches[2:]]
    sample_a = a.get_action(prompts())

    fresh = make_agent(algo, **kw)
    fresh.load_checkpoint(tmp_path / "ckpt")
    tail_b = [learn(fresh, b) for b in batches[2:]]
    sample_b = fresh.get_action(prompts())
    # bit-exact: the resume replays the same kernels on the same inputs
    assert [m["loss"] for m in tail_a] == [m["loss"] for m in tail_b]
    for (n, x), y in zip(actor_state(a).items(), actor_state(fresh).values(), strict=True):
        assert torch.equal(x, y), n  # bit-exact: the resume replays the same kernels
    assert all(  # bit-exact: integer token ids
        torch.equal(x, y)
        for x, y in zip(sample_a.completion_ids, sample_b.completion_ids, strict=True)
    )
    assert fresh.steps == a.steps == 16  # 4 batches x 2 epochs x 2 minibatches


def test_checkpoint_holds_no_pickle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent("GRPO")
    path = save_llm_checkpoint(agent, tmp_path / "c")
    suffixes = {p.suffix for p in path.rglob("*") if p.is_file()}
    assert suffixes <= {".safetensors", ".json", ".md"}, suffixes  # .md: peft's adapter card


def test_clone_is_independent_and_population_indexes() -> None:
    agent = make_agent("GRPO")
    twin = agent.clone(index=5)
    assert twin.index == 5
    b = make_batch()
    twin.learn(b.experiences())
    # bit-exact: did the twin's step move it at all
    changed = [n for n, p in actor_state(twin).items() if not torch.equal(p, actor_state(agent)[n])]
    assert changed  # the twin moved, the original did not follow
    model, _ = tiny_causal_lm("qwen2", seed=0)
    pop = GRPO.population(
        3,
        actor_network=model,
        pad_token_id=0,
        pad_token="<pad>",
        group_size=2,
        lora_config=lora_config(),
    )
    assert [p.index for p in pop] == [0, 1, 2]
    assert pop[1].policy is not pop[0].policy


def test_hyperparameter_mutation_is_bounded_and_logged() -> None:
    hp = HyperparameterConfig(
        lr=RLParameter(min=1e-5, max=2e-3), beta=RLParameter(min=0.0, max=0.1)
    )
    agent = make_agent("GRPO", hp_config=hp, lr=1e-3)
    rng = random.Random(0)
    for _ in range(20):
        rec = agent.mutate_hyperparameter(rng)
        spec = hp.params[rec["param"]]
        assert spec.min <= rec["after"] <= spec.max
    assert len(agent.mutation_history) == 20
    assert agent.optimizer.param_groups[0]["lr"] == agent.lr
    with pytest.raises(ValueError, match="min <= max"):
        RLParameter(min=1.0, max=0.0)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"lrr": RLParameter(min=1e-5, max=1e-3)}, r"'lrr' is not a hyperparameter of GRPO; mutable ones .*\blr\b"),
        ({"use_sequence_packing": RLParameter(min=0, max=1)}, r"GRPO\.use_sequence_packing is None; only numeric"),
        ({"group_size": RLParameter(min=2, max=8)}, r"group_size is an integer; pass RLParameter\(\.\.\., dtype=int\)"),
        ({"beta": RLParameter(min=-0.1, max=0.1)}, r"beta's RLParameter min=-0\.1 is a value GRPO refuses \(`lr` and `beta` must be >= 0"),
        ({"top_p": RLParameter(min=0.5, max=1.5)}, r"top_p's RLParameter max=1\.5 is a value GRPO refuses"),
    ],
)  # fmt: skip
def test_an_hp_config_its_mutations_could_not_apply_is_refused_when_built(
    params: dict[str, RLParameter], match: str
) -> None:
    """Mutations are clipped to the RLParameter's bounds: each name must be a numeric setting,
    an integer one mutates as ``dtype=int``, and both bounds must be values the agent accepts
    (before, an unknown name failed at the first mutation, mid-run, and ``beta`` could mutate to
    a negative value the constructor refuses)."""
    with pytest.raises(ValueError, match=match):
        make_agent("GRPO", hp_config=HyperparameterConfig(**params))
    agent = make_agent(
        "GRPO", hp_config=HyperparameterConfig(group_size=RLParameter(2, 8, dtype=int))
    )
    assert agent.mutate_hyperparameter(random.Random(0))["after"] in (2, 4)  # 3 * 0.8 or 3 * 1.2


def test_a_mutation_the_config_refuses_together_with_another_setting_changes_nothing() -> None:
    """The bounds are checked beside the settings the agent was built with; a setting changed
    since (here ``min_output_tokens``, set on the agent) can make a value inside the bounds one
    the config refuses beside it: the mutation raises, naming both, and changes nothing."""
    hp = HyperparameterConfig(max_output_tokens=RLParameter(min=4, max=8, dtype=int))
    agent = make_agent("GRPO", hp_config=hp, max_output_tokens=8)
    agent.min_output_tokens = 9  # either mutation (8 clipped, or 6) is below it
    with pytest.raises(
        ValueError, match=r"mutating max_output_tokens from 8 to [68]\b.*`min_output_tokens=9`"
    ):
        agent.mutate_hyperparameter(random.Random(0))
    assert agent.max_output_tokens == 8 and agent.mutation_history == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"top_p": 1.5}, r"`top_p` must be in \(0, 1\]"),
        ({"top_p": 0.0}, r"`top_p` must be in \(0, 1\]"),
        ({"min_p": -0.1}, r"`min_p` must be in \[0, 1\]"),
        ({"top_k": -1}, r"`top_k` must be >= 0, got -1; 0 is no cut \(vLLM's -1\)"),
        ({"repetition_penalty": 0.0}, r"`repetition_penalty` must be > 0"),
    ],
)  # fmt: skip
def test_sampling_filters_out_of_range_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_agent("GRPO", **kwargs)


def test_a_sampling_filter_of_none_is_off() -> None:
    """None switches a filter off, as in transformers' ``GenerationConfig`` (TRL's ``min_p``
    default), and is stored as the filter's neutral value."""
    agent = make_agent("GRPO", top_p=None, min_p=None, top_k=None, repetition_penalty=None)
    got = (agent.top_p, agent.min_p, agent.top_k, agent.repetition_penalty)
    assert got == (1.0, 0.0, 0, 1.0)
    with pytest.raises(ValueError, match=r"`top_k` must be a number \(or None: off\), got '50'"):
        make_agent("GRPO", top_k="50")


def test_an_update_that_overflows_the_weights_stops_at_that_step() -> None:
    """A finite loss and gradient with a learning rate beyond float32's range make the AdamW
    update infinite: the step that did it raises (it used to return, and the next ``learn()``
    failed on a NaN loss, after a checkpoint or evaluation could have used the weights), even
    with ``skip_nonfinite``, which cannot skip a step already applied."""
    agent = make_agent("GRPO", lr=1e39, skip_nonfinite=True)
    with pytest.raises(
        FloatingPointError,
        match=r"update at optimizer step 0 of GRPO made \d+ of \d+ trained tensors non-finite",
    ):
        agent.learn(make_batch().experiences())
    assert not all(bool(torch.isfinite(p).all()) for p in actor_state(agent).values())


def test_nonfinite_loss_never_reaches_the_weights() -> None:
    agent = make_agent("GRPO")
    _, param = next(
        (n, p) for n, p in agent.policy.named_parameters() if "lora_B" in n and p.requires_grad
    )
    with torch.no_grad():
        param[0, 0] = math.nan
    before = actor_state(agent)
    b = make_batch()
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at optimizer step 0"):
        agent.learn(b.experiences())
    for n, p in actor_state(agent).items():
        assert torch.allclose(p, before[n], equal_nan=True), n
    agent.skip_nonfinite = True
    with pytest.warns(RuntimeWarning, match="step skipped"):
        metrics = agent.learn(b.experiences())
    assert metrics["skipped_steps"] == 1.0
    assert agent.steps == 0


@pytest.mark.parametrize(
    ("factory", "attrs"),
    [
        (
            dr_grpo,
            {"adv_norm": "mean_only", "loss_aggregation": "seq_mean_token_sum_norm", "beta": 0.0},
        ),
        (dapo, {"clip_coef_high": 0.28, "loss_aggregation": "token_mean", "filter_zero_adv": True}),
        (rloo, {"advantage_estimator": "rloo", "loss_aggregation": "token_mean"}),
        (reinforce_pp, {"advantage_estimator": "reinforce_pp_baseline"}),
    ],
)
def test_presets_configure_grpo_and_learn(factory, attrs) -> None:  # type: ignore[no-untyped-def]
    agent = factory(actor_network=tiny_model(), pad_token_id=0, pad_token="<pad>", group_size=GROUP_SIZE,
                    lora_config=lora_config(), max_output_tokens=8, lr=1e-3)  # fmt: skip
    for k, v in attrs.items():
        assert getattr(agent, k) == v, k
    b = make_batch()
    before = actor_state(agent)
    metrics = agent.learn(b.experiences())
    assert math.isfinite(metrics["loss"])
    # bit-exact: did the step move the actor at all
    assert any(not torch.equal(p, before[n]) for n, p in actor_state(agent).items())


def test_gspo_and_cispo_pin_the_loss_type() -> None:
    kw = {
        "actor_network": tiny_model(),
        "pad_token_id": 0,
        "pad_token": "<pad>",
        "lora_config": lora_config(),
    }
    assert GSPO(**kw).loss_type == "gspo"
    assert GSPO(**{**kw, "actor_network": tiny_model()}).importance_sampling_level == "trajectory"
    assert CISPO(**{**kw, "actor_network": tiny_model()}, loss_type="grpo").loss_type == "cispo"


def test_seed_constructor_calls() -> None:
    """The seeds' constructor calls, with a tiny local model and tokenizer in place of the hub's."""
    model, tokenizer = tiny_causal_lm("qwen2", seed=0)
    agent = LLMREINFORCE(
        actor_network=model,
        pad_token_id=tokenizer.eos_token_id,
        pad_token=tokenizer.eos_token,
        device="cuda" if torch.cuda.is_available() else "cpu",
        batch_size=8,
        update_epochs=1,
        gamma=0.99,
        max_output_tokens=128,
        max_model_len=1024,
    )
    assert agent.gamma == 0.99
    model, tokenizer = tiny_causal_lm("qwen2", seed=0)
    agent = LLMPPO(
        actor_network=model,
        pad_token_id=tokenizer.eos_token_id,
        pad_token=tokenizer.eos_token,
        device="cuda" if torch.cuda.is_available() else "cpu",
        batch_size=8,
        update_epochs=1,
        clip_coef=0.2,
        max_output_tokens=128,
        max_model_len=1024,
    )
    model, tokenizer = tiny_causal_lm("qwen2", seed=0)
    agent = GRPO(
        actor_network=model,
        pad_token_id=tokenizer.eos_token_id,
        pad_token=tokenizer.eos_token,
        device="cuda" if torch.cuda.is_available() else "cpu",
        batch_size=8,
        group_size=8,
    )
    # pad == eos: learn() still counts an EOS action token
    comp, masks = agent.get_action(prompts(1))
    metrics = agent.learn((comp, masks, torch.arange(8, dtype=torch.float32)))
    assert math.isfinite(metrics["loss"])


def test_unknown_and_ignored_constructor_arguments() -> None:
    kw = {"pad_token_id": 0, "pad_token": "<pad>", "lora_config": lora_config()}
    with pytest.raises(TypeError, match=r"unexpected arguments \['no_such_option'\]"):
        GRPO(actor_network=tiny_model(), no_such_option=1, **kw)
    GRPO(
        actor_network=tiny_model(),
        calc_position_embeddings=True,
        wrap=True,
        torch_compiler=None,
        **kw,
    )
    with pytest.raises(ValueError, match="pass `actor_network`"):
        GRPO(**kw)
    with pytest.raises(ValueError, match="absolute ratio bounds"):
        GRPO(actor_network=tiny_model(), clip_coef=(1.2, 0.8), **kw)


#: (agent, keywords, words of the error): each setting changes nothing for that agent.
NO_EFFECT = [
    (
        "GRPO",
        {
            "lora_config": LoraConfig(
                r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]
            )
        },
        r"`lora_config.lora_dropout`=0.05 has no effect: agents keep the policy in eval\(\)",
    ),
    ("GRPO", {"clip_coef_high": 0.3, "clip_coef": (0.8, 1.2)}, "`clip_coef_high` has no effect"),
    ("GRPO", {"clip_coef_high": 0.3, "loss_type": "cispo"}, "pass cispo_eps_high"),
    ("CISPO", {"clip_coef_high": 0.3}, "`clip_coef_high` has no effect"),
    ("GRPO", {"clip_coef_high": 0.3, "loss_type": "reinforce"}, "takes no upper clip bound"),
    ("GRPO", {"clip_coef_high": 0.3, "loss_type": "importance_sampling"}, "clip_coef_high"),
    ("CISPO", {"clip_coef": 0.1}, "`clip_coef=0.1` has no effect with loss_type='cispo'"),
    ("CISPO", {"clip_coef": (0.8, 1.2), "cispo_clamp": "two_sided"}, r"`clip_coef=\(0.8, 1.2\)`"),
    ("GSPO", {"clip_coef": (0.8, 1.2)}, "GSPO takes scalar bounds"),
    ("GRPO", {"clip_coef": 0.1, "loss_type": "sapo"}, "`clip_coef=0.1` has no effect"),
    ("GRPO", {"clip_coef": None}, "`clip_coef=None` would clip at 0.2"),
    ("GSPO", {"clip_coef": None}, "`clip_coef=None` would clip at 0.2"),
    ("LLMPPO", {"clip_coef": None}, "`clip_coef=None` would clip at 0.2 in LLMPPO"),
    ("GRPO", {"cispo_eps_high": 2.0}, "`cispo_eps_high` is CISPO's"),
    ("GSPO", {"cispo_clamp": "two_sided"}, "`cispo_clamp` is CISPO's"),
    ("GRPO", {"turn_ratio_pooling": "sum"}, "the ratio here is per token"),
    ("GSPO", {"turn_ratio_pooling": "sum"}, "the ratio here is per sequence"),
    ("LLMREINFORCE", {"turn_ratio_pooling": "mean"}, "`turn_ratio_pooling` pools"),
    ("GRPO", {"max_length_norm": 8}, "`max_length_norm` is the L"),
    ("GRPO", {"adv_filter_eps": 0.1}, "`adv_filter_eps` is the threshold of filter_zero_adv"),
    ("GRPO", {"use_kl_advantage_shaping": True, "beta": 0.0}, "`use_kl_advantage_shaping=True`"),
    ("GRPO", {"adv_norm": "mean_only", "advantage_estimator": "rloo"}, "`adv_norm='mean_only'`"),
    ("GRPO", {"kl_kind": "k1", "beta": 0.0}, "`kl_kind='k1'`.*beta=0"),
    ("GRPO", {"kl_kind": "k2", "use_kl_advantage_shaping": True}, "into the advantages"),
    ("GRPO", {"kl_kind": "k2", "advantage_estimator": "reinforce_pp_baseline"}, "into the reward"),
    ("LLMREINFORCE", {"kl_kind": "k1", "beta": 0.0}, "`kl_kind='k1'`"),
    ("ILQL", {"kl_kind": "k2"}, "`kl_kind='k2'`"),
    (
        "GRPO",
        {"vllm_importance_sampling_cap": 3.0, "vllm_importance_sampling_correction": False},
        "`vllm_importance_sampling_cap`.*correction=False",
    ),
    (
        "LLMPPO",
        {"vllm_importance_sampling_cap": 3.0, "clip_against_sampler": True},
        "`vllm_importance_sampling_cap`.*clip_against_sampler=True",
    ),
    ("GRPO", {"use_separate_reference_adapter": False, "beta": 0.0}, "beta=0 reads no reference"),
    ("ILQL", {"use_separate_reference_adapter": True}, "beta=0 reads no reference"),
    ("ILQL", {"use_liger_loss": True}, "`use_liger_loss` has no effect on ILQL"),
    ("ILQL", {"clip_coef": 0.1}, "`clip_coef` has no effect on ILQL"),
    ("ILQL", {"clip_against_sampler": True}, "`clip_against_sampler` has no effect on ILQL"),
    ("ILQL", {"vllm_importance_sampling_correction": False}, "no sampling log-probs"),
    ("GRPO", {"min_output_tokens": 9, "max_output_tokens": 8}, "`min_output_tokens=9`"),
    ("LLMREINFORCE", {"min_output_tokens": 600}, "more than the 512 tokens"),
    ("GRPO", {"vllm_config": VLLMConfig()}, "`vllm_config` configures the colocated vLLM"),
    ("GRPO", {"stop_sequences": ["stop"]}, "`stop_sequences` are text and need a tokenizer"),
    ("GRPO", {"full_finetune": True}, "`lora_config` configures LoRA adapters"),
    (
        "GRPO",
        {"full_finetune": True, "lora_config": None, "lora_target_scope": "all"},
        "`lora_target_scope`",
    ),
    (
        "GRPO",
        {"full_finetune": True, "lora_config": None, "use_separate_reference_adapter": False},
        "full_finetune=True makes the reference a frozen copy",
    ),
    (
        "GRPO",
        {"full_finetune": True, "lora_config": None, "merge_lora_for_generation": False},
        "`merge_lora_for_generation=False`",
    ),
    ("GRPO", {"cast_logprobs_to_fp32": False}, "`cast_logprobs_to_fp32=False` has no counterpart"),
    ("GRPO", {"torch_compiler": "default"}, "`torch_compiler='default'`"),
    ("LLMPPO", {"action_granularity": "token"}, "a turn is one action"),
    ("ILQL", {"vllm_config": VLLMConfig()}, "`vllm_config`.*vLLM is not used by ILQL"),
    (
        "GRPO",
        {"advantage_granularity": "turn", "advantage_estimator": "reinforce_pp_baseline"},
        "`advantage_granularity='turn'`.*advantage_estimator='reinforce_pp_baseline'",
    ),
    (
        "GRPO",
        {
            "advantage_granularity": "turn",
            "advantage_estimator": "optimal_token_baseline",
            "importance_sampling_level": "turn",
        },
        "`advantage_granularity='turn'`.*advantage_estimator='optimal_token_baseline'",
    ),
]

#: (keywords, words of the error): an importance-sampling level the policy loss cannot take.
LEVEL_WITHOUT_LOSS = [
    ({"loss_type": "dro", "importance_sampling_level": "turn"},
     "`importance_sampling_level='turn'`.*loss_type='dro'.*pass importance_sampling_level='token'"),
    ({"loss_type": "gmpo", "importance_sampling_level": "trajectory"},
     "`importance_sampling_level='trajectory'`.*loss_type='gmpo'"),
    ({"loss_type": "vespo", "importance_sampling_level": "turn", "loss_aggregation": "token_mean"},
     "`importance_sampling_level='turn'`.*loss_type='vespo'"),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "words"), LEVEL_WITHOUT_LOSS)
def test_ratio_level_the_loss_cannot_take_is_refused_when_built(kw: dict, words: str) -> None:  # type: ignore[type-arg]
    """A turn or trajectory ratio with a registered loss that takes no ``level`` is refused
    when the agent is built (not with a TypeError at the first learn())."""
    with pytest.raises(ValueError, match=words):
        make_agent("GRPO", **kw)


@pytest.mark.parametrize(
    ("algo", "kw", "words"), NO_EFFECT, ids=[f"{a}-{'-'.join(k)}" for a, k, _ in NO_EFFECT]
)
def test_settings_without_effect_are_refused_by_name(algo: str, kw: dict, words: str) -> None:  # type: ignore[type-arg]
    """Nothing is silently ignored: a setting another setting turns off is refused when the
    agent is built, the message naming it and what to pass instead."""
    make = tl.make_ilql if algo == "ILQL" else functools.partial(make_agent, algo)
    with pytest.raises(ValueError, match=words):
        make(**kw)


def test_preset_defaults_the_caller_turns_off_are_left_out() -> None:
    """A preset's own value never trips the refusal: it is dropped where the caller's keywords
    make it a no-op, while the same value passed explicitly is refused."""
    kw = {"pad_token_id": 0, "pad_token": "<pad>", "lora_config": lora_config(), "group_size": 2}
    agent = dr_grpo(actor_network=tiny_model(), max_output_tokens=8, loss_aggregation="token_mean",
                    **kw)  # fmt: skip
    assert (agent.max_length_norm, agent.loss_aggregation) == (None, "token_mean")
    assert dr_grpo(actor_network=tiny_model(), max_output_tokens=8, **kw).max_length_norm == 8
    assert dapo(actor_network=tiny_model(), loss_type="cispo", **kw).clip_coef_high is None
    assert dapo(actor_network=tiny_model(), clip_coef=(0.8, 1.3), **kw).clip_coef_high is None
    assert dr_grpo(actor_network=tiny_model(), advantage_estimator="rloo", **kw).adv_norm == (
        "mean_std"
    )
    with pytest.raises(ValueError, match="`max_length_norm` is the L"):
        dr_grpo(actor_network=tiny_model(), max_length_norm=8, loss_aggregation="token_mean", **kw)
    with pytest.raises(ValueError, match="`kl_kind='k1'`"):  # the caller's own, with its beta=0
        dapo(actor_network=tiny_model(), kl_kind="k1", **kw)


def test_settings_that_take_effect_are_accepted() -> None:
    """The refusals' boundaries: each of these changes what the agent does."""
    for algo, kw in [
        ("GRPO", {"clip_coef_high": 0.3}),
        ("GSPO", {"clip_coef": 1e-3, "clip_coef_high": 2e-3}),
        ("CISPO", {"clip_coef": 0.1, "cispo_clamp": "two_sided"}),
        ("GRPO", {"loss_type": "importance_sampling", "clip_coef": (0.5, 2.0)}),
        ("GRPO", {"loss_type": "reinforce", "clip_coef": None}),
        ("GRPO", {"turn_ratio_pooling": "sum", "importance_sampling_level": "turn"}),
        ("GRPO", {"adv_norm": "mean_only", "advantage_estimator": "rloo",
                  "advantage_granularity": "turn"}),
        ("GRPO", {"kl_kind": "k1"}),
        ("GRPO", {"vllm_importance_sampling_cap": 3.0}),
        ("LLMREINFORCE", {"turn_ratio_pooling": "mean", "importance_sampling_level": "turn"}),
        ("LLMREINFORCE", {"clip_coef": None, "min_output_tokens": 512}),
        ("GRPO", {"calc_position_embeddings": True, "wrap": False, "clone": False,
                  "cast_logprobs_to_fp32": True, "action_granularity": "auto"}),
        ("GRPO", {"loss_type": "gspo", "importance_sampling_level": "trajectory"}),
        ("GRPO", {"loss_type": "cispo", "importance_sampling_level": "turn"}),
        ("GRPO", {"loss_type": "sapo", "importance_sampling_level": "trajectory"}),
    ]:  # fmt: skip
        make_agent(algo, perturb_seed=None, **kw)
    tl.make_ilql(temperature=0.5, top_k=5)
    # "auto" with an estimator that has no per-turn form: whole-sequence advantages, said so
    for estimator in ("reinforce_pp_baseline", "optimal_token_baseline"):
        agent = make_agent("GRPO", perturb_seed=None, importance_sampling_level="turn",
                           advantage_estimator=estimator)  # fmt: skip
        assert agent.advantage_granularity == "trajectory"
    assert make_agent("GRPO", importance_sampling_level="turn").advantage_granularity == "turn"


def test_load_classmethod_rebuilds_the_agent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent("GRPO", lr=1e-2, max_grad_norm=1.0)
    b = make_batch()
    agent.learn(b.experiences())
    agent.save_checkpoint(tmp_path / "c")
    loaded = GRPO.load(tmp_path / "c", actor_network=tiny_model(), lora_config=lora_config())
    assert type(loaded) is GRPO
    assert (loaded.group_size, loaded.lr, loaded.steps) == (agent.group_size, agent.lr, agent.steps)
    for (n, x), y in zip(actor_state(agent).items(), actor_state(loaded).values(), strict=True):
        assert torch.equal(x, y), n  # bit-exact: a save/load round trip
    with pytest.raises(ValueError, match="pass `actor_network`"):
        GRPO.load(tmp_path / "c")
    with pytest.raises(ValueError, match="not an agent checkpoint"):
        GRPO.load(tmp_path, actor_network=tiny_model())
    with pytest.raises(ValueError, match="holds a GRPO, not a LLMPPO"):
        LLMPPO.load(tmp_path / "c", actor_network=tiny_model())


@pytest.mark.parametrize(
    ("algo", "kw"),
    [
        ("GRPO", {}),
        ("GRPO", {"loss_type": "cispo"}),
        ("GRPO", {"loss_aggregation": "token_mean", "clip_coef": (0.8, 1.3)}),
        ("LLMREINFORCE", {}),
        ("LLMREINFORCE", {"clip_coef": None}),
        ("LLMPPO", {}),
    ],
)
def test_fused_loss_path_equals_the_plain_path(algo: str, kw: dict) -> None:  # type: ignore[type-arg]
    """use_liger_loss=True routes the policy term through rl_kernels.fused_policy_loss."""
    b = make_batch()
    grads = []
    losses = []
    for fused in (False, True):
        agent = make_agent(algo, use_liger_loss=fused, micro_batch_size_per_gpu=4, **kw)
        losses.append(agent.learn(b.experiences())["loss"])
        grads.append(
            {n: p.grad.clone() for n, p in agent.policy.named_parameters() if p.grad is not None}
        )
    assert grads[0].keys() == grads[1].keys()
    tl.assert_loss_close(losses[1], losses[0])
    tl.assert_grads_close(grads[1], grads[0])


def test_population_shares_the_frozen_base() -> None:
    """4 LoRA agents cost one base plus 4 adapter sets, and still train independently."""

    def storage(agents) -> int:  # type: ignore[no-untyped-def]
        seen: dict[int, int] = {}
        for a in agents:
            for t in [*a.policy.parameters(), *a.policy.buffers()]:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values())

    one = make_agent("GRPO", lr=1e-2)
    pop = [one] + [one.clone(index=i) for i in range(1, 4)]
    single, total = storage([one]), storage(pop)
    base = sum(
        p.numel() * p.element_size() for n, p in one.policy.named_parameters() if ".lora_" not in n
    )
    assert total < single + 3 * (single - base) + 1024  # only the adapters were copied
    assert total < 0.4 * 4 * single  # far below 4 full copies
    b = make_batch()
    pop[1].learn(b.experiences())
    # bit-exact: did the clone's step move it at all
    moved = [n for n, p in actor_state(pop[1]).items() if not torch.equal(p, actor_state(one)[n])]
    assert moved
    frozen_before = {
        n: p.clone()
        for n, p in one.policy.named_parameters()
        if not p.requires_grad and ".lora_" not in n
    }
    for n, p in pop[2].policy.named_parameters():
        if n in frozen_before:
            assert p.data_ptr() == dict(one.policy.named_parameters())[n].data_ptr()
            assert torch.equal(p, frozen_before[n])  # bit-exact: the frozen base is never written


def test_ppo_shared_critic_with_full_finetuning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """critic_mode='shared' (trlX's layout): a value head on the actor's hidden states."""
    kw = {
        "critic_mode": "shared",
        "full_finetune": True,
        "lora_config": None,
        "lr": 1e-2,
        "max_grad_norm": 1.0,
    }
    agent = make_agent("LLMPPO", perturb_seed=None, **kw)
    assert agent.policy.peft is None
    assert agent.policy.value_head is not None
    head0 = {n: p.detach().clone() for n, p in agent.policy.value_head.named_parameters()}
    b = make_batch()
    metrics = agent.learn(b.experiences())
    assert math.isfinite(metrics["value_loss"])
    # bit-exact: did the step move the value head at all
    assert any(not torch.equal(p, head0[n]) for n, p in agent.policy.value_head.named_parameters())
    agent.save_checkpoint(tmp_path / "c")
    twin = make_agent("LLMPPO", perturb_seed=None, **kw)
    twin.load_checkpoint(tmp_path / "c")
    for (n, p), q in zip(
        agent.policy.value_head.named_parameters(), twin.policy.value_head.parameters(), strict=True
    ):
        assert torch.equal(p, q), n  # bit-exact: a save/load round trip
    # bit-exact: the same kernels on the round-tripped weights
    assert agent.learn(b.experiences())["loss"] == twin.learn(b.experiences())["loss"]
    with pytest.raises(ValueError, match="`critic_mode` must be"):
        make_agent("LLMPPO", critic_mode="separate")


def test_reinforce_pp_counts_the_kl_once_in_the_reward_not_again_as_a_loss() -> None:
    """REINFORCE++ (arXiv 2501.03262 eq. 4) folds beta * KL into the reward; no KL loss term."""
    batch = tl.make_batch()
    experiences = (batch.ids, batch.masks, batch.rewards)
    agent = tl.make_agent("GRPO", advantage_estimator="reinforce_pp_baseline", beta=0.5)
    metrics = agent.learn(experiences)
    assert "kl" not in metrics
    assert metrics["loss"] == pytest.approx(metrics["pg_loss"], rel=1e-6, abs=1e-7)
    control = tl.make_agent("GRPO", beta=0.5)  # GRPO's KL is a loss term: loss != pg_loss
    cm = control.learn(experiences)
    assert cm["kl"] > 0 and abs(cm["loss"] - cm["pg_loss"]) > 1e-6


def test_filtered_groups_leave_the_loss_and_its_normaliser() -> None:
    """DAPO's dynamic sampling (arXiv 2503.14476 eq. 11): one step on a batch with an
    all-equal group equals one step on the batch without that group."""
    rewards = (1.0, 1.0, 1.0, 2.0, 0.0, 0.75)  # group 0 is all-equal: zero advantage
    full = tl.make_batch(rewards=rewards)
    kept = tl.make_batch(
        prompts=tl.PROMPTS[1:], completions=tl.COMPLETIONS[3:], rewards=rewards[3:]
    )
    kw = {"filter_zero_adv": True, "loss_aggregation": "token_mean", "beta": 0.0}
    a, b = tl.make_agent("GRPO", **kw), tl.make_agent("GRPO", **kw)
    ma = a.learn((full.ids, full.masks, full.rewards))
    mb = b.learn((kept.ids, kept.masks, kept.rewards))
    tl.assert_loss_close(ma["loss"], mb["loss"])
    # The step's gradients, not the weights after it: Adam's first step moves each weight by
    # about lr * sign(grad), 2 * lr apart where a near-zero gradient's sign differs by rounding.
    names = tl.trainable_names(a)
    assert names == tl.trainable_names(b)
    ga = tl.agent_grads(a.policy, names)
    assert max(float(g.abs().max()) for g in ga.values()) > 1e-3, "degenerate test case"
    tl.assert_grads_close(ga, tl.agent_grads(b.policy, names))


def test_every_group_filtered_takes_no_optimizer_step() -> None:
    """DAPO's dynamic sampling with every group all-equal: no row carries a gradient, so no
    optimizer step runs (AdamW would still move the weights by its moments and count the step,
    the schedule would advance) and the call reports kept_groups 0 and no loss diagnostics."""
    kw = {"filter_zero_adv": True, "loss_aggregation": "token_mean", "beta": 0.0}
    schedule = CosineLRScheduleConfig(num_epochs=10, warmup_proportion=0.0)
    agent = tl.make_agent("GRPO", cosine_lr_schedule_config=schedule, **kw)
    first = agent.learn(make_batch().experiences())  # a real step: AdamW now has moments
    assert first["kept_groups"] == 2.0 and "loss" in first and agent.steps == 1
    params = {n: p.detach().clone() for n, p in agent.policy.named_parameters()}
    optimizer = copy.deepcopy(agent.optimizer.state_dict())
    scheduler = copy.deepcopy(agent.lr_scheduler.state_dict())
    flat = make_batch(rewards=(1.0, 1.0, 1.0, 0.5, 0.5, 0.5))  # both groups all-equal
    metrics = agent.learn(flat.experiences())
    assert metrics["kept_groups"] == 0.0
    shown = {"loss", "mean_loss", "grad_norm", "pg_loss", "entropy", "clip_fraction", "approx_kl"}
    assert not shown & set(metrics), sorted(metrics)
    assert metrics["mean_reward"] == pytest.approx(0.75)
    assert agent.steps == 1
    for n, p in agent.policy.named_parameters():
        assert torch.equal(p, params[n]), n  # bit-exact: no optimizer step ran
    after = agent.optimizer.state_dict()
    assert after["param_groups"] == optimizer["param_groups"]
    assert after["state"].keys() == optimizer["state"].keys()
    for i, state in optimizer["state"].items():
        for key, value in state.items():
            # bit-exact: AdamW's moments and step count were not touched
            assert torch.equal(after["state"][i][key], value), (i, key)
    assert agent.lr_scheduler.state_dict() == scheduler


def test_shared_value_head_seeding_leaves_the_cuda_generators_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared critic's value head is seeded on the CPU generator only (restored after):
    ``torch.manual_seed`` would also reseed every CUDA generator, which nothing restores."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    agent = tl.make_agent("LLMPPO", critic_mode="shared")
    assert agent.policy.value_head is not None and calls == []
