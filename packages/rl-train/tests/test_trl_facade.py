"""rl_train.trl: TRL's GRPOConfig / GRPOTrainer signatures, their mapping and their errors."""

from __future__ import annotations

import pytest
from datasets import Dataset
from rl_train.tiny import tiny_model, tiny_tokenizer
from rl_train.trl import GRPOConfig, GRPOTrainer


def reward_len(completions, **kwargs):  # type: ignore[no-untyped-def]
    return [-abs(5 - len(c)) for c in completions]


def _dataset() -> Dataset:
    return Dataset.from_list([{"prompt": f"{d}+1="} for d in range(10)])


def test_the_config_maps_to_the_agent() -> None:
    tok = tiny_tokenizer()
    args = GRPOConfig(
        learning_rate=1e-4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_generations=4, max_completion_length=3, max_prompt_length=20, beta=0.04,
        epsilon=0.1, epsilon_high=0.3, num_iterations=2, loss_type="grpo", scale_rewards="none",
        seed=3,
    )  # fmt: skip
    trainer = GRPOTrainer(tiny_model(len(tok)), reward_len, args, _dataset(), processing_class=tok)
    cfg = trainer.agent.config
    assert (cfg.lr, cfg.group_size, cfg.batch_size, cfg.micro_batch_size_per_gpu) == (1e-4, 4, 8, 4)
    assert (cfg.max_output_tokens, cfg.max_model_len, cfg.beta) == (3, 23, 0.04)
    assert (cfg.clip_coef, cfg.clip_coef_high, cfg.update_epochs) == (0.1, 0.3, 2)
    assert (cfg.loss_aggregation, cfg.adv_norm, cfg.seed) == ("seq_mean_token_mean", "mean_only", 3)
    assert (cfg.top_k, cfg.top_p, cfg.temperature) == (0, 1.0, 1.0)
    batch = trainer.env.reset()
    assert len(batch) == 2 and batch[0]["text"].endswith("+1=")  # prompts: 4 * 2 / 4 = 2
    dapo = GRPOTrainer(tiny_model(len(tok)), [reward_len], GRPOConfig(), _dataset(),
                       processing_class=tok)  # fmt: skip
    assert dapo.agent.config.loss_aggregation == "token_mean"  # TRL's default loss_type
    assert dapo.agent.config.adv_norm == "mean_std" and dapo.agent.config.beta == 0.0
    gdpo = GRPOTrainer(tiny_model(len(tok)), [reward_len, reward_len],
                       GRPOConfig(multi_objective_aggregation="normalize_then_sum",
                                  reward_weights=[1.0, 0.5]),
                       _dataset(), processing_class=tok)  # fmt: skip
    assert gdpo.agent.config.advantage_estimator == "gdpo"  # TRL's GDPO: eps 1e-4, batch std
    assert gdpo.agent.config.advantage_estimator_kwargs == {"eps": 1e-4, "batch_scale": True}
    assert gdpo.env.reward_weights == [1.0, 0.5]


def test_settings_trl_does_not_read_in_a_case_are_left_out() -> None:
    """TRL's CISPO reads only ``epsilon_high`` (the weight's cap), GDPO ignores
    ``scale_rewards``, the cap needs the correction: the agent (which refuses a setting that
    changes nothing) gets what TRL reads."""
    tok = tiny_tokenizer()
    args = GRPOConfig(loss_type="cispo", epsilon=0.3, epsilon_high=3.0)
    cispo = GRPOTrainer(tiny_model(len(tok)), reward_len, args, _dataset(), processing_class=tok)
    assert (cispo.agent.config.loss_type, cispo.agent.config.cispo_eps_high) == ("cispo", 2.0)
    args = GRPOConfig(
        multi_objective_aggregation="normalize_then_sum", scale_rewards="none",
        vllm_importance_sampling_cap=3.0,
    )  # fmt: skip
    gdpo = GRPOTrainer(tiny_model(len(tok)), [reward_len, reward_len], args, _dataset(),
                       processing_class=tok)  # fmt: skip
    assert gdpo.agent.config.advantage_estimator == "gdpo"


def test_bad_settings_name_the_field() -> None:
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="loss_type='sapo_x' is not supported"):
        GRPOConfig(loss_type="sapo_x")
    with pytest.raises(ValueError, match="scale_rewards='batch' is not supported"):
        GRPOConfig(scale_rewards="batch")
    with pytest.raises(ValueError, match="multi_objective_aggregation='sum' is not one of TRL"):
        GRPOConfig(multi_objective_aggregation="sum")
    with pytest.raises(ValueError, match=r"\(6\) must be a multiple of num_generations \(4"):
        GRPOConfig(per_device_train_batch_size=6, num_generations=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'vllm_mode_x'"):
        GRPOConfig(vllm_mode_x="colocate")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="reward models given by name are not supported"):
        GRPOTrainer(tiny_model(len(tok)), ["some/reward-model"], GRPOConfig(), _dataset(),
                    processing_class=tok)  # type: ignore[list-item]  # fmt: skip
    with pytest.raises(ValueError, match="pass `processing_class`"):
        GRPOTrainer(tiny_model(len(tok)), reward_len, GRPOConfig(), _dataset())
    with pytest.raises(ValueError, match="needs `train_dataset`"):
        GRPOTrainer(tiny_model(len(tok)), reward_len, GRPOConfig(), processing_class=tok)


def test_router_aux_loss_coef_weights_a_mixture_of_experts_models_balance_loss() -> None:
    """TRL's ``router_aux_loss_coef``: None takes the model config's weight (Qwen3-MoE's
    0.001), 0.0 turns the loss off, and a weight on a dense model is refused."""
    from rl_testing.models import tiny_causal_lm

    tok = tiny_tokenizer()
    for coef, expected in ((None, 0.001), (0.05, 0.05), (0.0, None)):
        model, _ = tiny_causal_lm("qwen3_moe", tok, seed=0)
        args = GRPOConfig(per_device_train_batch_size=4, num_generations=4,
                          router_aux_loss_coef=coef)  # fmt: skip
        balance = GRPOTrainer(
            model, reward_len, args, _dataset(), processing_class=tok
        ).agent.router_balance
        assert (balance.coef if balance is not None else None) == expected
    args = GRPOConfig(per_device_train_batch_size=4, num_generations=4, router_aux_loss_coef=0.01)
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.01\): Qwen2ForCausalLM is not"):
        GRPOTrainer(tiny_model(len(tok)), reward_len, args, _dataset(), processing_class=tok)
