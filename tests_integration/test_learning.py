"""Every algorithm learns from scratch: the embedded tiny model on a built-in task, on CPU.

Each case trains a freshly built 78k-parameter Qwen2 (full fine-tuning) with fixed seeds and
must reach greedy test accuracy >= 0.9 (an evaluation every 25 steps) within 300 steps (PPO and
DAPO: 450) of 8 prompts x 8 samples (REINFORCE and PPO: 64 prompts x 1), and must not collapse
afterwards: the accuracy after the last step is >= 0.8 (``AFTER``). Accuracy starts at 0.0.
At lr 1e-3 the clip-higher / IS-weight objectives wobble once converged: measured after issue
19's fused AdamW, CISPO 0.875, 1.0, 1.0, 0.85 at steps 225-300 and DAPO 1.0 at 300-425, 0.85
at 450 (6 of the 40 test prompts); the final check tells such a wobble from a collapse.

Packing (issue 20) is the default, so this table runs packed forwards; the padded opt-out and
token-budget micro-batches are the variants below. Packed and padded updates differ by float
rounding only (``packages/rl-algos/tests/test_packing.py``: loss and every gradient to 1e-5,
Dr. GRPO included: its loss normaliser, the constant ``max_length_norm`` =
``max_output_tokens``, and ``Learner.normalizers`` are the same global numbers in both
layouts), but RL at lr 1e-3 amplifies rounding into different trajectories, and Dr. GRPO sits
on a knife edge there. Its advantages are only centred (no division by the group's reward
std, which is <= 0.5 for 0/1 rewards), so a nearly solved group still pushes, and after
converging it overshoots whatever the layout (lr 1e-3, below). At lr 7e-4 it converges a
little later and then holds 1.0, in both layouts and both seeds, so the table gives Dr. GRPO
lr 7e-4 (``LR``) within the same 300 steps. Measured (accuracy at the evaluations of steps
175-300; seed = DemoConfig and model seed; 2026-11-24; the lr 7e-4 default rows from runs of
450 steps, which stayed at 1.0 to the end):

=========================  ====  ==========================================  ======
Dr. GRPO                   seed  steps 175, 200, 225, 250, 275, 300           passes
=========================  ====  ==========================================  ======
lr 7e-4 default (packed)   0     0.0, 0.0, 0.525, 0.9, 1.0, 1.0              yes
lr 7e-4 default (packed)   1     0.0, 0.325, 0.825, 0.975, 1.0, 1.0          yes
lr 7e-4 padded (opt-out)   0     0.0, 0.0, 0.7, 0.85, 1.0, 1.0               yes
lr 7e-4 padded (opt-out)   1     0.0, 0.325, 0.725, 0.975, 1.0, 1.0         yes
lr 7e-4 48-token mbs       0     0.0, 0.0, 0.525, 0.85, 1.0, 1.0             yes
lr 1e-3 default (packed)   0     0.45, 0.825, 1.0, 0.825, 0.825, 0.825       barely
lr 1e-3 default (packed)   1     0.55, 0.525, 0.85, 1.0, 0.95, 0.95          yes
lr 1e-3 padded (opt-out)   0     0.45, 0.975, 1.0, 1.0, 1.0, 1.0             yes
lr 1e-3 padded (opt-out)   1     0.55, 0.525, 0.85, 1.0, 1.0, 1.0            yes
lr 1e-3 48-token mbs       0     0.45, 0.75, 0.85, 0.675, 0.85, 0.85         no
lr 1e-3 48-token mbs       1     0.55, 0.525, 0.85, 1.0, 1.0, 1.0            yes
=========================  ====  ==========================================  ======

Other settings were worse: lr 2e-3 (seed 0) peaks at 0.575 packed and 0.725 padded; lr 5e-4
learns too slowly for 300 steps (seed 0: 0.875 at 300; seed 1: 0.525; the slow run's padded
and token-budget Dr. GRPO cases failed at 5e-4 too, max 0.875).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_train import MetricsLogger, finetune_llm_reasoning
from rl_train.demo import DemoConfig, build_agent, build_env
from rl_train.evaluation import greedy_accuracy
from rl_train.tiny import tiny_model, tiny_tokenizer

ALGOS = ["grpo", "gspo", "cispo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce", "ppo"]
TARGET = 0.9
AFTER = 0.8
# steps; 300 for the others. PPO (shared-trunk critic) is slower to start; DAPO's dynamic
# sampling drops the all-wrong groups that dominate early on (measured: 0.8 at step 275, 1.0 at
# 300), and at lr 1e-3 it wobbles after converging (after issue 19's on-policy learn(), whose
# ratio is exactly 1: 1.0 at 300-375, 0.85 at 400, 1.0 at 425-450), so it gets PPO's budget
BUDGET = {"ppo": 450, "dapo": 450}
#: lr; the demo's 1e-3 for the others. Dr. GRPO: the module docstring's table.
LR = {"dr_grpo": 7e-4}


@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_learns_successor_digit(algo: str, tmp_path: Path) -> None:
    _learns_successor_digit(algo, tmp_path)


#: The plain table above runs the default, packed forwards (``use_sequence_packing=None``:
#: every forward packs, as the tiny Qwen2 runs SDPA). The explicit padded opt-out
#: (``use_sequence_packing=False``): one case per agent class in the integration run, the other
#: presets and GRPO variants in the slow run (``nox -s slow``).
PADDED_ALGOS = [
    *(pytest.param(a) for a in ("grpo", "reinforce", "ppo")),
    *(
        pytest.param(a, marks=pytest.mark.slow)
        for a in ("gspo", "cispo", "dr_grpo", "dapo", "rloo", "reinforce_pp")
    ),
]


@pytest.mark.parametrize("algo", PADDED_ALGOS)
def test_algorithm_learns_padded(algo: str, tmp_path: Path) -> None:
    """The table holds with the padded opt-out (packed and padded differ by float rounding)."""
    _learns_successor_digit(algo, tmp_path, use_sequence_packing=False)


#: Packed rows in token-budget micro-batches (``micro_batch_tokens=48``, issue 20): one case
#: per agent class, and Dr. GRPO (the module docstring's table), in the slow run.
TOKEN_BUDGET_ALGOS = ["grpo", "dr_grpo", "reinforce", "ppo"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", TOKEN_BUDGET_ALGOS)
def test_algorithm_learns_with_token_budget_micro_batches(algo: str, tmp_path: Path) -> None:
    """The table holds with packed rows in micro-batches of at most 48 tokens (issue 20)."""
    _learns_successor_digit(algo, tmp_path, use_sequence_packing=True, micro_batch_tokens=48)


def _learns_successor_digit(algo: str, tmp_path: Path, **options: object) -> None:
    config = DemoConfig(algo=algo, seed=0, lr=LR.get(algo, DemoConfig.lr))
    tok = tiny_tokenizer()
    env = build_env(config, tok)
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)
    for name, value in options.items():
        setattr(agent, name, value)  # config fields: reach the next learn()
    assert greedy_accuracy(agent, env) <= 0.1
    assert agent.use_sequence_packing is options.get("use_sequence_packing")
    finetune_llm_reasoning(
        [agent],
        env,
        max_steps=BUDGET.get(algo, 300),
        evaluation_interval=25,
        run_dir=tmp_path,
        verbose=False,
        plot=False,
        tensorboard=False,
        max_reward=None,
        eval_fn=lambda a: {"eval_accuracy": greedy_accuracy(a, env)},
    )
    history = MetricsLogger.read(tmp_path / "metrics.jsonl")
    accuracy = [r["eval_accuracy"] for r in history if "eval_accuracy" in r]
    assert max(accuracy) >= TARGET, accuracy
    assert greedy_accuracy(agent, env) >= AFTER, accuracy
    report = agent.packing_report  # what the default (None, "auto") chose: always packed
    if options.get("use_sequence_packing") is None:
        assert report.packed_forwards > 0 and report.padded_forwards == 0, report


@pytest.mark.parametrize("algo", ["grpo", "reinforce", "ppo"])
def test_multiturn_guess_the_number_improves_with_turn_level_credit(
    algo: str, tmp_path: Path
) -> None:
    """GRPO with per-turn group-relative advantages, LLMREINFORCE with per-turn returns (ReBN)
    and LLMPPO with turn-level GAE: the greedy episode return on unseen seeds rises clearly over the untrained policy
    (from -0.2, invalid guesses, to >= 0.1; a correct guess is worth 1)."""
    from rl_envs import TokenObservationWrapper
    from rl_envs.tasks import GuessTheNumberEnv
    from rl_train import finetune_llm_multiturn
    from rl_train.evaluation import greedy_return as _greedy_return

    tok = tiny_tokenizer()
    config = DemoConfig(algo=algo, seed=0, group_size=8, max_model_len=96)
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)
    if algo == "grpo":
        agent.advantage_granularity = "turn"

    def env_factory() -> TokenObservationWrapper:
        game = GuessTheNumberEnv(0, 3, max_guesses=3, wrong_reward=0.0, invalid_reward=-0.1)
        return TokenObservationWrapper(
            game,
            tok,
            max_turns=3,
            pad_id=0,
            max_model_len=96,
            max_output_tokens=2,
            apply_chat_template=False,
        )

    before = _greedy_return(agent, env_factory, 32, seed=10**6)
    finetune_llm_multiturn(
        [agent],
        max_turns=3,
        env_factory=env_factory,
        max_steps=120,
        evaluation_interval=40,
        batch_size=4 if algo == "grpo" else 32,
        group_size=8 if algo == "grpo" else 1,
        run_dir=tmp_path,
        verbose=False,
        tensorboard=False,
        plot=False,
    )
    after = _greedy_return(agent, env_factory, 32, seed=10**6)
    assert before < 0
    assert after >= 0.1, (before, after)


def test_tool_calling_secret_digit_learns_with_grpo(tmp_path: Path) -> None:
    """Issue 22: the built-in tool task (rl_envs.tools.SecretDigitEnv). The answer is a secret
    digit drawn per episode that only the `peek` tool reveals; a guess without peeking earns
    nothing. GRPO takes the greedy success rate (exact secret after a peek) from 0.0 to >= 0.8
    on unseen seeds, through the compact tool-call syntax and the tiny tool chat template."""
    import functools

    from rl_envs import ToolEnvWrapper
    from rl_envs.tools import (
        TINY_TOOL_CHAT_TEMPLATE,
        SecretDigitEnv,
        parse_compact_tool_calls,
        secret_digit_reward,
        secret_digit_rows,
    )
    from rl_train import finetune_llm_multiturn
    from rl_train.evaluation import greedy_success_rate

    tok = tiny_tokenizer()
    tok.chat_template = TINY_TOOL_CHAT_TEMPLATE
    rows = functools.partial(secret_digit_rows, digits="0123456789")

    def env_factory() -> ToolEnvWrapper:
        return ToolEnvWrapper(
            SecretDigitEnv(),
            tok,
            rows,
            max_tool_calls=1,
            pad_id=tok.eos_token_id,
            max_model_len=48,
            max_output_tokens=1,
            parser=parse_compact_tool_calls,
            reward_fn=secret_digit_reward,
        )

    # lr 5e-4 (half the demo's): at 1e-3 the greedy rate reaches 1.0 and then falls back when
    # the call token "!" takes over the answer turn too (measured: 1.0 at step 40, 0.3 at 50)
    config = DemoConfig(
        algo="grpo", seed=0, group_size=16, max_output_tokens=1, max_model_len=48, lr=5e-4
    )
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)
    assert greedy_success_rate(agent, env_factory, 40, seed=10**6) <= 0.1
    rates = []
    for chunk in range(6):  # at most 150 steps of 4 tasks x 16 episodes
        finetune_llm_multiturn(
            [agent],
            max_turns=2,
            env_factory=env_factory,
            max_steps=25,
            evaluation_interval=1000,
            batch_size=4,
            group_size=16,
            seed=chunk * 10_000,
            run_dir=tmp_path,
            verbose=False,
            tensorboard=False,
            plot=False,
        )
        rates.append(greedy_success_rate(agent, env_factory, 40, seed=10**6))
        if len(rates) >= 2 and min(rates[-2:]) >= 0.8:
            break  # two evaluations in a row: learned, and it holds
    print(f"greedy success every 25 steps: {rates}")
    assert min(rates[-2:]) >= 0.8, rates
