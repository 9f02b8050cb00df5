"""The bad-input catalogue: public entry points, bad arguments, the error and what it names.

``test_bad_inputs.py`` runs every case; ``docs/bad-inputs.md`` is generated from the same
table (``python tests_integration/bad_inputs.py > docs/bad-inputs.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Case:
    package: str
    call: str
    error: type[Exception]
    names: str
    run: Callable[[], Any]


def _t(*shape: int, fill: float | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    return x.fill_(fill) if fill is not None else x


def _m(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.bool)


def _tiny() -> Any:
    from rl_testing.models import tiny_causal_lm

    return tiny_causal_lm("qwen2", seed=0)


def _gym(**kw: Any) -> Any:
    from datasets import Dataset
    from rl_envs import ReasoningGym

    ds = kw.pop("ds", Dataset.from_dict({"question": ["a", "b"], "answer": ["1", "2"]}))
    args: dict[str, Any] = {"train_dataset": ds, "test_dataset": ds, "tokenizer": _tiny()[1],
                            "reward_fn": lambda c, a, q: 0.0,
                            "conversation_template": [{"role": "user", "content": "{question}"}],
                            "data_batch_size_per_gpu": 2}  # fmt: skip
    args.update(kw)
    return ReasoningGym(**args)


def _experience(samples: Any, rewards: Any) -> Any:
    from rl_train.offline import make_experience

    return make_experience(samples, rewards, _tiny()[1], max_length=16)


def _gym_step(completions: Any, reward: Any = None) -> Any:
    env = _gym(reward_fn=reward or (lambda c, a, q: 0.0))
    env.reset()
    return env.step(completions)


def _grpo(**kw: Any) -> Any:
    from rl_algos import GRPO

    model, _ = _tiny()
    kw.setdefault("group_size", 2)
    return GRPO(actor_network=model, pad_token_id=0, pad_token="<pad>", **kw)


def _moe_grpo(**kw: Any) -> Any:
    from rl_algos import GRPO
    from rl_testing.models import tiny_causal_lm

    model, _ = tiny_causal_lm("qwen3_moe", seed=0)
    return GRPO(actor_network=model, pad_token_id=0, pad_token="<pad>", group_size=2, **kw)


def _r3_on_a_server_without_routes() -> None:
    from rl_algos.server_sync import use_server
    from rl_rollout import HFEngine, RolloutServer
    from rl_testing.models import tiny_causal_lm

    agent = _moe_grpo(router_replay="R3")
    with RolloutServer(HFEngine(*tiny_causal_lm("qwen3_moe", seed=0))) as server:
        use_server(agent, server.url, timeout=60.0)


def _moe_ilql(**kw: Any) -> Any:
    from rl_algos import ILQL
    from rl_testing.models import tiny_causal_lm

    model, _ = tiny_causal_lm("qwen3_moe", seed=0)
    return ILQL(actor_network=model, pad_token_id=0, pad_token="<pad>", **kw)


def _hp(**bounds: tuple[float, float]) -> Any:
    from rl_algos import HyperparameterConfig, RLParameter

    return HyperparameterConfig(**{k: RLParameter(*v) for k, v in bounds.items()})


def _lora(**kw: Any) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], **kw)


def _ilql(**kw: Any) -> Any:
    from rl_algos import ILQL

    model, _ = _tiny()
    return ILQL(actor_network=model, pad_token_id=0, pad_token="<pad>", **kw)


def _vllm_config() -> Any:
    from rl_algos import VLLMConfig

    return VLLMConfig()


def _learn(ids: torch.Tensor, masks: torch.Tensor, rewards: torch.Tensor, **kw: Any) -> Any:
    return _grpo(**kw).learn((ids, masks, rewards))


IDS = torch.tensor([[1, 8, 9, 10, 2], [1, 8, 11, 2, 0]])
MASKS = torch.tensor([[False, True, True, True], [False, True, True, False]])


def _non_empty_dir() -> str:
    import tempfile
    from pathlib import Path

    directory = tempfile.mkdtemp()
    (Path(directory) / "notes.txt").write_text("not a checkpoint")
    return directory


def _config(text: str) -> Any:
    import tempfile

    from rl_train.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return load_config(f.name)


def cases() -> list[Case]:
    import rl_advantages as adv
    import rl_kernels as ker
    import rl_losses as los
    from rl_rollout import HFEngine, RemoteEngine, SamplingParams

    return [
        # rl-advantages
        Case("rl-advantages", "group_relative(rewards with NaN)", ValueError, "rewards",
             lambda: adv.group_relative(torch.tensor([1.0, math.nan, 0.0, 1.0]), 2)),
        Case("rl-advantages", "group_relative(N=6, group_size=4)", ValueError, "group_size",
             lambda: adv.group_relative(_t(6), 4)),
        Case("rl-advantages", "gae(values of another shape)", ValueError, "values",
             lambda: adv.gae(_t(2, 3), _t(2, 4), _m(2, 3), 1.0, 0.95)),
        Case("rl-advantages", "rebn(returns 1-D)", ValueError, "returns",
             lambda: adv.rebn(_t(4), _m(4))),
        Case("rl-advantages", "discounted_returns(gamma=1.5)", ValueError, "gamma",
             lambda: adv.discounted_returns(_t(2, 3), _m(2, 3), 1.5)),
        Case("rl-advantages", "group_relative(empty batch)", ValueError, "rewards",
             lambda: adv.group_relative(torch.zeros(0), 2)),
        Case("rl-advantages", "gae(mask holding 0.5)", ValueError, "mask",
             lambda: adv.gae(_t(2, 3), _t(2, 3), torch.full((2, 3), 0.5), 1.0, 0.95)),
        # rl-losses
        Case("rl-losses", "clipped_surrogate(old_logprobs of another shape)", ValueError, "old_logprobs",
             lambda: los.clipped_surrogate(_t(2, 3), _t(2, 4), _t(2), _m(2, 3))),
        Case("rl-losses", "clipped_surrogate(clip_low=-0.1)", ValueError, "clip_low",
             lambda: los.clipped_surrogate(_t(2, 3), _t(2, 3), _t(2), _m(2, 3), clip_low=-0.1)),
        Case("rl-losses", "aggregate(mode='mean')", ValueError, "mode",
             lambda: los.aggregate(_t(2, 3), _m(2, 3), "mean")),  # type: ignore[arg-type]
        Case("rl-losses", "kl_penalty(kind='k4')", ValueError, "kind",
             lambda: los.kl_penalty(_t(2, 3), _t(2, 3), _m(2, 3), kind="k4")),  # type: ignore[arg-type]
        Case("rl-losses", "clipped_surrogate(level='turn', no turn_ids)", ValueError, "turn_ids",
             lambda: los.clipped_surrogate(_t(2, 3), _t(2, 3), _t(2), _m(2, 3), level="turn")),
        Case("rl-losses", "value_loss(returns of another shape)", ValueError, "returns",
             lambda: los.value_loss(_t(2, 3), _t(2, 3), _t(3, 3), _m(2, 3))),
        Case("rl-losses", "clipped_surrogate(integer advantages)", ValueError, "advantages",
             lambda: los.clipped_surrogate(_t(2, 3), _t(2, 3), torch.ones(2, dtype=torch.long), _m(2, 3))),
        Case("rl-losses", "aggregate(normalizer=torch.tensor(0.0))", ValueError, "normalizer",
             lambda: los.aggregate(_t(2, 3), _m(2, 3), normalizer=torch.tensor(0.0))),
        # rl-kernels
        Case("rl-kernels", "fused_logprobs(targets >= V)", ValueError, "targets",
             lambda: ker.fused_logprobs(_t(4, 8), _t(10, 8), torch.tensor([0, 1, 2, 10]))),
        Case("rl-kernels", "fused_logprobs(weight with another H)", ValueError, "weight",
             lambda: ker.fused_logprobs(_t(4, 8), _t(10, 6), torch.tensor([0, 1, 2, 3]))),
        Case("rl-kernels", "fused_policy_loss(objective='gspo')", ValueError, "objective",
             lambda: ker.fused_policy_loss(_t(2, 3, 8), _t(10, 8), torch.zeros(2, 3, dtype=torch.long), _m(2, 3), _t(2), objective="gspo")),
        Case("rl-kernels", "fused_policy_loss(kl_coef=0.1, no ref_logprobs)", ValueError, "ref_logprobs",
             lambda: ker.fused_policy_loss(_t(2, 3, 8), _t(10, 8), torch.zeros(2, 3, dtype=torch.long), _m(2, 3), _t(2), kl_coef=0.1)),
        # rl-adapters
        Case("rl-adapters", "PolicyModel(reference='copy') in LoRA mode", ValueError, "reference",
             lambda: __import__("rl_adapters").PolicyModel(_tiny()[0], reference="copy")),
        Case("rl-adapters", "PolicyModel(critic=True, full_finetune=True)", ValueError, "critic",
             lambda: __import__("rl_adapters").PolicyModel(_tiny()[0], critic=True, full_finetune=True, reference="copy")),
        Case("rl-adapters", "load_checkpoint(a directory that is not one)", ValueError, "manifest",
             lambda: __import__("rl_adapters").load_checkpoint(__import__("rl_adapters").PolicyModel(_tiny()[0]), "/tmp")),
        Case("rl-adapters", "save_checkpoint(into a directory that holds other files)", ValueError, "directory",
             lambda: __import__("rl_adapters").save_checkpoint(__import__("rl_adapters").PolicyModel(_tiny()[0]), _non_empty_dir())),
        # rl-rollout
        Case("rl-rollout", "SamplingParams(top_p=0)", ValueError, "top_p", lambda: SamplingParams(top_p=0.0)),
        Case("rl-rollout", "SamplingParams(n=0)", ValueError, "n", lambda: SamplingParams(n=0)),
        Case("rl-rollout", "HFEngine.generate([])", ValueError, "prompts",
             lambda: HFEngine(*_tiny()).generate([], SamplingParams())),
        Case("rl-rollout", "HFEngine.generate(prompt longer than the limit)", ValueError, "max_model_len",
             lambda: HFEngine(*_tiny(), max_model_len=16).generate([[5] * 20], SamplingParams(max_new_tokens=4))),
        Case("rl-rollout", "RemoteEngine('localhost:8000')", ValueError, "base_url",
             lambda: RemoteEngine("localhost:8000")),
        Case("rl-rollout", "SamplingParams(stop='###')", ValueError, "stop", lambda: SamplingParams(stop="###")),  # type: ignore[arg-type]
        Case("rl-rollout", "HFEngine.generate('hello')", ValueError, "prompts",
             lambda: HFEngine(*_tiny()).generate("hello", SamplingParams())),  # type: ignore[arg-type]
        # rl-envs
        Case("rl-envs", "ReasoningGym(dataset without question/answer)", ValueError, "question",
             lambda: _gym(ds=__import__("datasets").Dataset.from_dict({"prompt": ["x"], "solution": ["y"]}))),
        Case("rl-envs", "ReasoningGym(empty dataset)", ValueError, "empty",
             lambda: _gym(ds=__import__("datasets").Dataset.from_dict({"question": [], "answer": []}))),
        Case("rl-envs", "ReasoningGym.step(reward_fn returns NaN)", ValueError, "reward_fn",
             lambda: _gym_step([["x"], ["y"]], lambda c, a, q: math.nan)),
        Case("rl-envs", "ReasoningGym.step(3 completions for 2 prompts)", ValueError, "completions",
             lambda: _gym_step([["x"], ["y"], ["z"]])),
        Case("rl-envs", "TokenObservationWrapper(max_turns=0)", ValueError, "max_turns",
             lambda: __import__("rl_envs").TokenObservationWrapper(None, _tiny()[1], 0, 0, 64, 8)),
        Case("rl-envs", "ReasoningGym(data_batch_size_per_gpu=0)", ValueError, "data_batch_size_per_gpu",
             lambda: _gym(data_batch_size_per_gpu=0)),
        Case("rl-envs", "RemoteReward('localhost:8001')", ValueError, "url",
             lambda: __import__("rl_envs.remote_reward").remote_reward.RemoteReward("localhost:8001")),
        Case("rl-envs", "RemoteReward(url, retries=-1)", ValueError, "retries",
             lambda: __import__("rl_envs.remote_reward").remote_reward.RemoteReward("http://h:1", retries=-1)),
        Case("rl-envs", "ReasoningGym(reward_weights=[nan])", ValueError, "reward_weights",
             lambda: _gym(reward_weights=[math.nan])),
        Case("rl-envs", "ReasoningGym(reward_timeout=0)", ValueError, "reward_timeout",
             lambda: _gym(reward_timeout=0)),
        # rl-algos
        Case("rl-algos", "GRPO.learn(N=2 rows, group_size=4)", ValueError, "group_size",
             lambda: _learn(IDS, MASKS, torch.ones(2), group_size=4)),
        Case("rl-algos", "GRPO(importance_sampling_level='turn').learn(no turn_ids)", ValueError, "turn_ids",
             lambda: _learn(IDS, MASKS, torch.ones(2), importance_sampling_level="turn")),
        Case("rl-algos", "GRPO(use_liger_loss=True, importance_sampling_level='trajectory')", ValueError, "use_liger_loss",
             lambda: _grpo(use_liger_loss=True, importance_sampling_level="trajectory")),
        Case("rl-algos", "learn(action_masks [N, L] instead of [N, L-1])", ValueError, "action_masks",
             lambda: _learn(IDS, torch.ones(2, 5, dtype=torch.bool), torch.ones(2))),
        Case("rl-algos", "learn(rewards with inf)", ValueError, "rewards",
             lambda: _learn(IDS, MASKS, torch.tensor([1.0, math.inf]))),
        Case("rl-algos", "GRPO(clip_coef=(1.2, 0.8))", ValueError, "clip_coef",
             lambda: _grpo(clip_coef=(1.2, 0.8))),
        Case("rl-algos", "GRPO(no_such_option=1)", TypeError, "no_such_option",
             lambda: _grpo(no_such_option=1)),
        Case("rl-algos", "GRPO(router_aux_loss_coef=0.01) on a dense model", ValueError, "router_aux_loss_coef",
             lambda: _grpo(router_aux_loss_coef=0.01)),
        Case("rl-algos", "ILQL(router_aux_loss_coef=0.01) on an MoE model", ValueError, "router_aux_loss_coef",
             lambda: _moe_ilql(router_aux_loss_coef=0.01)),
        Case("rl-algos", "GRPO(router_replay='R2') on a dense model", ValueError, "router_replay",
             lambda: _grpo(router_replay="R2")),
        Case("rl-algos", "GRPO(router_replay='R3', use_vllm=True)", ValueError, "use_vllm",
             lambda: _moe_grpo(router_replay="R3", use_vllm=True)),
        Case("rl-algos", "GRPO(router_replay='R3').learn((ids, masks, rewards)): no sampler routes", ValueError,
             "sampling_routes", lambda: _moe_grpo(router_replay="R3").learn(
                 (torch.tensor([[1, 5, 6], [1, 7, 8]]), torch.tensor([[False, True], [False, True]]),
                  torch.tensor([1.0, 0.0])))),
        Case("rl-algos", "use_server(GRPO(router_replay='R3'), url): a server without routes", ValueError,
             "--record-routes", _r3_on_a_server_without_routes),
        Case("rl-rollout", "HFEngine(record_routes=True) on a dense model", ValueError, "record_routes",
             lambda: HFEngine(*_tiny(), record_routes=True)),
        Case("rl-algos", "GRPO(router_replay='R2', share_prompt_prefix=True)", ValueError, "share_prompt_prefix",
             lambda: _moe_grpo(router_replay="R2", share_prompt_prefix=True)),
        Case("rl-algos", "GRPO(router_replay='R2', clip_against_sampler=True)", ValueError, "clip_against_sampler",
             lambda: _moe_grpo(router_replay="R2", clip_against_sampler=True)),
        Case("rl-algos", "ILQL(router_replay='R2') on an MoE model", ValueError, "router_replay",
             lambda: _moe_ilql(router_replay="R2")),
        Case("rl-algos", "GRPO(loss_type='cispo', clip_coef_high=0.3)", ValueError, "clip_coef_high",
             lambda: _grpo(loss_type="cispo", clip_coef_high=0.3)),
        Case("rl-algos", "GRPO(max_length_norm=8) (token_mean / seq_mean_token_mean)", ValueError, "max_length_norm",
             lambda: _grpo(max_length_norm=8)),
        Case("rl-algos", "GRPO(kl_kind='k1', beta=0)", ValueError, "kl_kind",
             lambda: _grpo(kl_kind="k1", beta=0.0)),
        Case("rl-algos", "GRPO(adv_filter_eps=0.1) without filter_zero_adv", ValueError, "adv_filter_eps",
             lambda: _grpo(adv_filter_eps=0.1)),
        Case("rl-algos", "GRPO(full_finetune=True, lora_config=LoraConfig(...))", ValueError, "lora_config",
             lambda: _grpo(full_finetune=True, lora_config=_lora())),
        Case("rl-algos", "GRPO(cast_logprobs_to_fp32=False)", ValueError, "cast_logprobs_to_fp32",
             lambda: _grpo(cast_logprobs_to_fp32=False)),
        Case("rl-algos", "GRPO(lora_config=LoraConfig(bias='all'))", ValueError, "bias",
             lambda: _grpo(lora_config=_lora(bias="all"))),
        Case("rl-algos", "GRPO(loss_type='dro', importance_sampling_level='turn')", ValueError, "importance_sampling_level",
             lambda: _grpo(loss_type="dro", importance_sampling_level="turn")),
        Case("rl-algos", "GRPO(advantage_granularity='turn', advantage_estimator='reinforce_pp_baseline')", ValueError, "advantage_granularity",
             lambda: _grpo(advantage_granularity="turn", advantage_estimator="reinforce_pp_baseline")),
        Case("rl-algos", "ILQL(vllm_config=VLLMConfig())", ValueError, "vllm_config",
             lambda: _ilql(vllm_config=_vllm_config())),
        Case("rl-algos", "GRPO(loss_type='gspo', importance_sampling_level='token')", ValueError, "importance_sampling_level",
             lambda: _grpo(loss_type="gspo", importance_sampling_level="token")),
        Case("rl-algos", "GRPO(importance_sampling_level='turn', loss_aggregation='token_mean', loss_kwargs={'unit_weight': 'unit'})", ValueError, "unit_weight",
             lambda: _grpo(importance_sampling_level="turn", loss_aggregation="token_mean", loss_kwargs={"unit_weight": "unit"})),
        Case("rl-algos", "GRPO(top_p=1.5)", ValueError, "top_p", lambda: _grpo(top_p=1.5)),
        Case("rl-algos", "GRPO(hp_config=HyperparameterConfig(lrr=RLParameter(1e-5, 1e-3)))", ValueError, "lrr",
             lambda: _grpo(hp_config=_hp(lrr=(1e-5, 1e-3)))),
        Case("rl-algos", "GRPO(hp_config=HyperparameterConfig(beta=RLParameter(-0.1, 0.1)))", ValueError, "beta",
             lambda: _grpo(hp_config=_hp(beta=(-0.1, 0.1)))),
        # rl-train
        Case("rl-train", "config with key train.stepz", ValueError, "train.stepz",
             lambda: _config("train:\n  stepz: 3\n")),
        Case("rl-train", "config with algo: grpoo", ValueError, "algo", lambda: _config("algo: grpoo\n")),
        Case("rl-train", "config with train.report_to: mlfow", ValueError, "report_to",
             lambda: _config("train:\n  report_to: mlfow\n")),
        Case("rl-train", "config with data.reward_url: localhost:8001", ValueError, "data.reward_url",
             lambda: _config("data:\n  reward_url: localhost:8001\n")),
        Case("rl-train", "config with a missing DeepSpeed file", ValueError, "deepspeed_config",
             lambda: _config("deepspeed_config: /no/ds.json\n")),
        Case("rl-train", "config with train.steps: many", ValueError, "train.steps",
             lambda: _config("train:\n  steps: many\n")),
        # ILQL: bad offline data and loss inputs
        Case("rl-losses", "expectile_loss(values [2, 3], target_q [2, 4], ...)", ValueError, "target_q",
             lambda: __import__("rl_losses").expectile_loss(_t(2, 3), _t(2, 4), _m(2, 3))),
        Case("rl-train", "make_experience(samples, rewards=None)", ValueError, "rewards",
             lambda: _experience(["a", "b"], None)),
        Case("rl-train", "make_experience(3 samples, 2 rewards)", ValueError, "rewards",
             lambda: _experience(["a", "b", "c"], [1.0, 0.0])),
        Case("rl-train", "make_experience([], [])", ValueError, "samples",
             lambda: _experience([], [])),
        Case("rl-train", "make_experience(samples, [nan, 1.0])", ValueError, "rewards",
             lambda: _experience(["a", "b"], [math.nan, 1.0])),
    ]  # fmt: skip


def markdown() -> str:
    lines = [
        "# Bad input: what each entry point rejects",
        "",
        "Generated from `tests_integration/bad_inputs.py`; `tests_integration/test_bad_inputs.py`",
        "checks every row: the exception type, and that the message names the argument.",
        "",
        "| package | call | error | message names |",
        "|---|---|---|---|",
    ]
    for c in cases():
        lines.append(f"| {c.package} | `{c.call}` | `{c.error.__name__}` | `{c.names}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
