"""finetune_llm_reasoning / finetune_llm_multiturn on the embedded tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rl_envs import TokenObservationWrapper
from rl_envs.tasks import GuessTheNumberEnv
from rl_train import (
    MetricsLogger,
    finetune_llm_multiturn,
    finetune_llm_reasoning,
    latest_checkpoint,
)
from rl_train.demo import DemoConfig, build_agent, build_env
from rl_train.tiny import tiny_model, tiny_tokenizer


def demo_agent_env(algo: str = "grpo", seed: int = 0, max_model_len: int = 64):  # type: ignore[no-untyped-def]
    config = DemoConfig(algo=algo, seed=seed, prompts_per_step=4, group_size=4, n_train=40,
                        n_test=8, max_model_len=max_model_len)  # fmt: skip
    tok = tiny_tokenizer()
    env = build_env(config, tok)
    agent = build_agent(config, tiny_model(len(tok), seed), tok)
    return agent, env


def kill_at(step: int):  # type: ignore[no-untyped-def]
    """A ``log_fn`` that stops the run at ``step``, as a kill would: after the step's metrics
    row, before its checkpoint (the hooks log before they save)."""

    def log_fn(row: dict[str, float]) -> None:
        if row["step"] == step:
            raise KeyboardInterrupt(f"killed at step {step}")

    return log_fn


def test_resume_after_interruption_equals_uninterrupted(tmp_path: Path) -> None:
    agent, env = demo_agent_env()
    finetune_llm_reasoning([agent], env, max_steps=8, evaluation_interval=4, checkpoint_steps=4,
                           run_dir=tmp_path / "full", verbose=False, plot=False)  # fmt: skip
    full = MetricsLogger.read(tmp_path / "full" / "metrics.jsonl")

    # the "killed" run: killed at step 6, checkpoint at 4; its last 2 steps are lost with it
    agent, env = demo_agent_env()
    with pytest.raises(KeyboardInterrupt):
        finetune_llm_reasoning([agent], env, max_steps=8, evaluation_interval=4,
                               checkpoint_steps=4, run_dir=tmp_path / "cut", verbose=False,
                               plot=False, log_fn=kill_at(6))  # fmt: skip
    assert json.loads((tmp_path / "cut" / "checkpoints" / "latest.json").read_text())["step"] == 4
    agent, env = demo_agent_env()  # a fresh process: new agent, new environment
    finetune_llm_reasoning([agent], env, max_steps=8, evaluation_interval=4, checkpoint_steps=4,
                           run_dir=tmp_path / "cut", resume=True, verbose=False, plot=False)  # fmt: skip
    resumed = MetricsLogger.read(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(1, 9))
    for a, b in zip(full, resumed, strict=True):
        a.pop("step_time"), b.pop("step_time")
        assert a == b


def test_early_stop_at_max_reward_and_elite(tmp_path: Path) -> None:
    agent, env = demo_agent_env()
    pop = finetune_llm_reasoning([agent], env, max_steps=50, evaluation_interval=1, max_reward=-1.0,
                                 run_dir=tmp_path, verbose=False, save_elite=True)  # fmt: skip
    rows = MetricsLogger.read(tmp_path / "metrics.jsonl")
    assert len(rows) == 1  # stopped after the first evaluation
    assert (tmp_path / "reward_curve.png").is_file()
    assert (tmp_path / "elite").is_dir()
    assert pop[0] is agent
    assert latest_checkpoint(tmp_path) is None


def test_loop_argument_checks(tmp_path: Path) -> None:
    agent, env = demo_agent_env()
    with pytest.raises(ValueError, match="`pop` is empty"):
        finetune_llm_reasoning([], env, max_steps=1, run_dir=tmp_path)
    with pytest.raises(ValueError, match="`evaluation_interval` must be >= 1"):
        finetune_llm_reasoning([agent], env, max_steps=1, evaluation_interval=0, run_dir=tmp_path)


@pytest.mark.parametrize("algo", ["grpo", "reinforce", "ppo"])
def test_multiturn_loop_runs_with_turn_level_credit(tmp_path: Path, algo: str) -> None:
    agent, _ = demo_agent_env(algo, max_model_len=160)
    tok = agent.tokenizer

    def env_factory() -> TokenObservationWrapper:
        return TokenObservationWrapper(GuessTheNumberEnv(0, 3, max_guesses=3), tok, max_turns=3,
                                       pad_id=tok.pad_token_id, max_model_len=128, max_output_tokens=2)  # fmt: skip

    finetune_llm_multiturn([agent], max_turns=3, env_factory=env_factory, max_steps=2,
                           evaluation_interval=2, batch_size=2, group_size=2, run_dir=tmp_path,
                           verbose=False)  # fmt: skip
    rows = MetricsLogger.read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert "fitness" in rows[-1]
    assert agent.steps >= 2


def test_evolution_with_tournament_and_mutations(tmp_path: Path) -> None:
    from rl_algos import HyperparameterConfig, RLParameter
    from rl_train import Mutations, TournamentSelection

    hp = HyperparameterConfig(lr=RLParameter(min=1e-4, max=1e-2))
    pop = []
    for i in range(3):
        agent, env = demo_agent_env(seed=0)
        agent.hp_config, agent.index = hp, i
        pop.append(agent)
    tournament = TournamentSelection(tournament_size=2, elitism=True, population_size=3, seed=0)
    mutation = Mutations(no_mutation=0.0, rl_hp=1.0, rand_seed=0)
    out = finetune_llm_reasoning(pop, env, max_steps=4, evaluation_interval=2, evo_steps=2,
                                 tournament=tournament, mutation=mutation, run_dir=tmp_path,
                                 verbose=False, plot=False)  # fmt: skip
    assert [a.index for a in out] == [0, 1, 2]
    assert all(a is not b for a in out for b in pop)  # the next generations are clones
    assert len(out[1].mutation_history) >= 1  # mutated twice over two generations, bounded
    assert all(1e-4 <= rec["after"] <= 1e-2 for a in out for rec in a.mutation_history)
    assert out[0].mutation_history == [] or out[0].mutation_history[-1]["step"] < out[0].steps
    with pytest.raises(ValueError, match="only mutate RL hyperparameters"):
        Mutations(architecture=0.2)

    # AgileRL's rules for the three arguments, in both loops (checked before any step)
    agent, env = demo_agent_env()
    for kw, message in (
        ({"tournament": tournament, "mutation": mutation}, "need `evo_steps`"),
        ({"evo_steps": 0, "tournament": tournament, "mutation": mutation}, "`evo_steps` must be"),
    ):
        with pytest.raises(ValueError, match=message):
            finetune_llm_reasoning([agent], env, max_steps=1, run_dir=tmp_path / "bad", **kw)
        with pytest.raises(ValueError, match=message):
            finetune_llm_multiturn([agent], 3, lambda: None, max_steps=1,  # type: ignore[arg-type,return-value]
                                   run_dir=tmp_path / "bad", **kw)  # fmt: skip
    with pytest.warns(UserWarning, match="will not evolve"):
        finetune_llm_reasoning([agent], env, max_steps=1, evo_steps=1, tournament=tournament,
                               run_dir=tmp_path / "alone", verbose=False, plot=False)  # fmt: skip
    assert agent.steps == 1


def test_crash_in_the_middle_of_a_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    """The second agent's save dies mid-way (as under SIGKILL): the pointer still names the
    previous complete checkpoint, and a resumed run starts from it."""
    a, env = demo_agent_env()
    b, _ = demo_agent_env(seed=1)
    real_save = b.save_checkpoint
    calls = {"n": 0}

    def dying_save(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            Path(path).mkdir(parents=True)
            (Path(path) / "partial.safetensors").write_bytes(b"\x00" * 10)
            raise KeyboardInterrupt("killed while writing")
        return real_save(path, *args, **kwargs)

    b.save_checkpoint = dying_save  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        finetune_llm_reasoning([a, b], env, max_steps=6, evaluation_interval=2, checkpoint_steps=2,
                               run_dir=tmp_path, verbose=False, plot=False)  # fmt: skip
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    assert latest.name == "step_00000002"
    a2, env2 = demo_agent_env()
    b2, _ = demo_agent_env(seed=1)
    finetune_llm_reasoning([a2, b2], env2, max_steps=6, evaluation_interval=2, checkpoint_steps=2,
                           run_dir=tmp_path, resume=True, verbose=False, plot=False)  # fmt: skip
    assert latest_checkpoint(tmp_path).name == "step_00000006"  # type: ignore[union-attr]
    assert [r["step"] for r in MetricsLogger.read(tmp_path / "metrics.jsonl")] == list(range(1, 7))


def test_tool_episodes_train_and_greedy_success_rate(tmp_path: Path) -> None:
    """ToolEnvWrapper episodes (issue 22) run through finetune_llm_multiturn; the success rate
    counts greedy episodes whose return reaches the threshold."""
    import functools

    from rl_envs import ToolEnvWrapper
    from rl_envs.tools import (
        TINY_TOOL_CHAT_TEMPLATE,
        SecretDigitEnv,
        parse_compact_tool_calls,
        secret_digit_reward,
        secret_digit_rows,
    )
    from rl_train.evaluation import greedy_success_rate

    tok = tiny_tokenizer()
    tok.chat_template = TINY_TOOL_CHAT_TEMPLATE
    config = DemoConfig(algo="grpo", group_size=4, max_output_tokens=1, max_model_len=48)
    agent = build_agent(config, tiny_model(len(tok), seed=0), tok)

    def env_factory() -> ToolEnvWrapper:
        return ToolEnvWrapper(SecretDigitEnv(), tok, functools.partial(secret_digit_rows, digits="01"),
                              max_tool_calls=1, pad_id=tok.eos_token_id, max_model_len=48,
                              max_output_tokens=1, parser=parse_compact_tool_calls,
                              reward_fn=secret_digit_reward)  # fmt: skip

    finetune_llm_multiturn([agent], max_turns=2, env_factory=env_factory, max_steps=2,
                           evaluation_interval=2, batch_size=2, group_size=4, run_dir=tmp_path,
                           verbose=False, tensorboard=False, plot=False)  # fmt: skip
    assert agent.steps >= 2
    assert greedy_success_rate(agent, env_factory, 2, seed=0, success=0.0) == 1.0
    assert greedy_success_rate(agent, env_factory, 2, seed=0, success=1.01) == 0.0


def test_multiturn_loop_resumes_like_an_uninterrupted_run_and_refuses_unknown_arguments(
    tmp_path: Path,
) -> None:
    """AgileRL's checkpoint_steps, resume and max_reward hold for the multi-turn loop too; an
    argument it does not know is an error, not silently dropped."""

    def run(run_dir: Path, steps: int, **kw: object) -> None:
        agent, _ = demo_agent_env("grpo", max_model_len=160)
        tok = agent.tokenizer

        def env_factory() -> TokenObservationWrapper:
            return TokenObservationWrapper(GuessTheNumberEnv(0, 3, max_guesses=3), tok,
                                           max_turns=3, pad_id=tok.pad_token_id,
                                           max_model_len=128, max_output_tokens=2)  # fmt: skip

        finetune_llm_multiturn([agent], max_turns=3, env_factory=env_factory, max_steps=steps,
                               evaluation_interval=2, batch_size=2, group_size=2,
                               checkpoint_steps=2, run_dir=run_dir, verbose=False,
                               tensorboard=False, plot=False, **kw)  # type: ignore[arg-type]  # fmt: skip

    run(tmp_path / "full", 4)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", 4, log_fn=kill_at(3))
    assert json.loads((tmp_path / "cut" / "checkpoints" / "latest.json").read_text())["step"] == 2
    run(tmp_path / "cut", 4, resume=True)
    full = MetricsLogger.read(tmp_path / "full" / "metrics.jsonl")
    resumed = MetricsLogger.read(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed, strict=True):
        a.pop("step_time"), b.pop("step_time")
        assert a == b

    run(tmp_path / "stop", 4, max_reward=-1.0)  # any evaluation reaches it: stop at step 2
    assert [r["step"] for r in MetricsLogger.read(tmp_path / "stop" / "metrics.jsonl")] == [1, 2]
    with pytest.raises(TypeError, match="checkpoint_step"):
        run(tmp_path / "typo", 1, checkpoint_step=1)


def test_the_last_step_and_an_early_stop_are_checkpointed(tmp_path: Path) -> None:
    """A run whose length is not a multiple of checkpoint_steps saves its last step too, and
    so does one that max_reward stops early; without checkpoint_steps nothing is saved."""
    agent, env = demo_agent_env()
    finetune_llm_reasoning([agent], env, max_steps=3, evaluation_interval=2, checkpoint_steps=2,
                           run_dir=tmp_path / "odd", verbose=False, plot=False)  # fmt: skip
    names = sorted(p.name for p in (tmp_path / "odd" / "checkpoints").glob("step_*"))
    assert names == ["step_00000002", "step_00000003"]
    assert latest_checkpoint(tmp_path / "odd").name == "step_00000003"  # type: ignore[union-attr]

    agent, env = demo_agent_env()
    finetune_llm_reasoning([agent], env, max_steps=50, evaluation_interval=1, max_reward=-1.0,
                           checkpoint_steps=10, run_dir=tmp_path / "stop", verbose=False,
                           plot=False)  # fmt: skip
    assert latest_checkpoint(tmp_path / "stop").name == "step_00000001"  # type: ignore[union-attr]


@pytest.mark.parametrize("every", [0, -5, True, 2.5])
def test_checkpoint_steps_must_be_none_or_at_least_one(tmp_path: Path, every: object) -> None:
    """0 used to mean never and -5 every 5 steps (``step % -5 == 0``); each loop refuses them
    before it writes anything."""
    from rl_train.loops import offline_learning_loop
    from rl_train.offline import make_experience

    agent, env = demo_agent_env()
    message = r"`checkpoint_steps` must be None \(no checkpoints\) or an integer >= 1"
    with pytest.raises(ValueError, match=message):
        finetune_llm_reasoning([agent], env, max_steps=1, checkpoint_steps=every,  # type: ignore[arg-type]
                               run_dir=tmp_path / "r")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        finetune_llm_multiturn([agent], 3, lambda: None, max_steps=1, checkpoint_steps=every,  # type: ignore[arg-type,return-value]
                               run_dir=tmp_path / "m")  # fmt: skip
    data = make_experience([("1", "2")], [1.0], agent.tokenizer, normalize_rewards=False)
    with pytest.raises(ValueError, match=message):
        offline_learning_loop(agent, data, steps=1, checkpoint_steps=every, run_dir=tmp_path / "o")  # type: ignore[arg-type]
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


def test_a_checkpoint_with_nonfinite_weights_is_refused(tmp_path: Path) -> None:
    """Weights that an update made inf (here set so after step 3's update) are not saved:
    the run stops naming the step, and latest.json keeps naming the last good checkpoint."""
    import torch

    agent, env = demo_agent_env()

    def diverge(row: dict[str, float]) -> None:
        if row["step"] == 3:  # after the step's update, before its checkpoint
            with torch.no_grad():
                agent.actor_parameters()[0].fill_(float("inf"))

    with pytest.raises(FloatingPointError, match=r"checkpoint of step 3 refused.*NaN or inf"):
        finetune_llm_reasoning([agent], env, max_steps=4, evaluation_interval=4,
                               checkpoint_steps=1, run_dir=tmp_path, verbose=False, plot=False,
                               log_fn=diverge)  # fmt: skip
    assert latest_checkpoint(tmp_path).name == "step_00000002"  # type: ignore[union-attr]
    assert not (tmp_path / "checkpoints" / "step_00000003").exists()


def test_rewriting_a_step_keeps_the_one_latest_names_until_the_new_one_is_complete(
    tmp_path: Path,
) -> None:
    """A save of a step that exists (latest.json names it) dies mid-way: the old step is whole
    and still the latest. A kill between the two renames of the swap is undone on read."""
    from rl_train.checkpoint import save_checkpoint

    agent, env = demo_agent_env()
    finetune_llm_reasoning([agent], env, max_steps=2, evaluation_interval=2, checkpoint_steps=2,
                           run_dir=tmp_path, verbose=False, plot=False)  # fmt: skip
    step = tmp_path / "checkpoints" / "step_00000002"
    before = sorted(p.relative_to(step) for p in step.rglob("*"))

    def dying_save(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        Path(path).mkdir(parents=True)
        (Path(path) / "partial.safetensors").write_bytes(b"\x00" * 10)
        raise KeyboardInterrupt("killed while writing")

    agent.save_checkpoint = dying_save  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, [agent], None)
    assert sorted(p.relative_to(step) for p in step.rglob("*")) == before
    assert latest_checkpoint(tmp_path) == step

    step.rename(step.parent / ".step_00000002.old")  # killed after moving it aside
    assert latest_checkpoint(tmp_path) == step
    assert sorted(p.relative_to(step) for p in step.rglob("*")) == before


def test_a_resume_reports_each_step_once_in_the_files_and_tensorboard(tmp_path: Path) -> None:
    """A run killed after step 6 (checkpoint 4) resumes: metrics.jsonl and TensorBoard show
    steps 5 and 6 once, the resumed run's. Killed before its first checkpoint, ``resume``
    starts at step 1 and the killed run's rows go too (they were not computed by this run)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def steps(run_dir: Path) -> tuple[list[int], list[tuple[int, float]]]:
        events = EventAccumulator(str(run_dir / "tensorboard"))
        events.Reload()
        rows = MetricsLogger.read(run_dir / "metrics.jsonl")
        return [r["step"] for r in rows], [(e.step, e.value) for e in events.Scalars("loss")]

    for name, kill, expected in (("late", 6, list(range(1, 9))), ("early", 3, list(range(1, 9)))):
        agent, env = demo_agent_env()
        with pytest.raises(KeyboardInterrupt):
            finetune_llm_reasoning([agent], env, max_steps=8, evaluation_interval=4,
                                   checkpoint_steps=4, run_dir=tmp_path / name, verbose=False,
                                   plot=False, log_fn=kill_at(kill))  # fmt: skip
        agent, env = demo_agent_env()
        finetune_llm_reasoning([agent], env, max_steps=8, evaluation_interval=4,
                               checkpoint_steps=4, run_dir=tmp_path / name, resume=True,
                               verbose=False, plot=False)  # fmt: skip
        rows, scalars = steps(tmp_path / name)
        assert rows == expected, name
        assert [s for s, _ in scalars] == expected, name
        losses = {
            r["step"]: r["loss"] for r in MetricsLogger.read(tmp_path / name / "metrics.jsonl")
        }
        assert all(abs(v - losses[s]) <= 1e-6 * max(1.0, abs(v)) for s, v in scalars), name


def test_a_failed_trial_never_wins_a_tournament() -> None:
    """An agent whose evaluation came out NaN (a failed trial) ranks below every agent with a
    number, wherever it stands in the population: it is neither the elite nor cloned."""
    import math

    from rl_train import TournamentSelection

    for failed in range(3):
        pop = []
        for i, score in enumerate([1.0, 2.0, 3.0]):
            agent, _ = demo_agent_env()
            agent.index, agent.fitness = i, [math.nan if i == failed else score]
            pop.append(agent)
        best = max(range(3), key=lambda i: -1.0 if i == failed else pop[i].fitness[0])
        for seed in range(5):
            elite, nxt = TournamentSelection(2, True, 3, seed=seed).select(pop)
            assert elite is pop[best], (failed, seed)
            assert not any(math.isnan(a.fitness[-1]) for a in nxt), (failed, seed)
