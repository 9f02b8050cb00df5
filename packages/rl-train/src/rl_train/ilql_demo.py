"""``rl-train demo --algo ilql``: log a behaviour dataset on a built-in task, learn offline.

:func:`behaviour_dataset` answers each training question with a scripted policy of mixed quality
(right, a systematic mistake, or random); :func:`run_ilql_demo` trains :class:`rl_algos.ILQL`
on that dataset alone and reports greedy and value-guided accuracy before and after.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rl_algos import ILQL, ILQLConfig
from rl_envs.tasks import train_test_split_task

from rl_train.demo import DemoConfig, build_env
from rl_train.evaluation import greedy_accuracy
from rl_train.loops import offline_learning_loop
from rl_train.offline import make_experience
from rl_train.tiny import TINY_AGENT, demo_reward, tiny_model, tiny_tokenizer

__all__ = ["ILQL_DEMO_AGENT", "ILQLDemoConfig", "behaviour_dataset", "run_ilql_demo"]


#: What the demo sets on top of :class:`rl_algos.ILQLConfig`'s defaults: the tiny model's
#: settings (:data:`rl_train.tiny.TINY_AGENT`), full fine-tuning, and target heads that follow
#: within a 300-step run (ILQLConfig's ``alpha=0.001``, trlX's, is for runs of many thousand
#: steps) with stronger guidance at decoding.
ILQL_DEMO_AGENT: dict[str, Any] = {
    **{k: TINY_AGENT[k] for k in ("lr", "max_grad_norm", "max_output_tokens", "max_model_len")},
    "full_finetune": True,
    "batch_size": 32,
    "alpha": 0.1,
    "steps_for_target_q_sync": 1,
    "decode_beta": 4.0,
}


@dataclass
class ILQLDemoConfig:
    """Settings of ``rl-train demo --algo ilql`` (and of the integration test).

    The agent's settings are :class:`rl_algos.ILQLConfig`'s defaults, then
    :data:`ILQL_DEMO_AGENT`, then ``agent``: :meth:`agent_settings` resolves them.
    """

    task: str = "successor_digit"
    """A built-in task of :mod:`rl_envs.tasks`."""
    steps: int = 300
    """Optimizer steps on the logged dataset."""
    n_train: int = 400
    """Questions the behaviour policy answers (one logged sample each)."""
    n_test: int = 40
    """Test questions."""
    seed: int = 0
    """Seed of the model, the data, the behaviour policy and the minibatch order."""
    p_correct: float = 0.2
    """Probability that the behaviour policy answers correctly."""
    p_distractor: float = 0.5
    """Probability of its systematic mistake (each character shifted by one), so the most
    frequent logged answer is wrong and imitation alone fails."""
    evaluation_interval: int = 50
    """Steps between evaluations."""
    agent: dict[str, Any] = field(default_factory=dict)
    """:class:`rl_algos.ILQL` settings on top of :data:`ILQL_DEMO_AGENT` (e.g.
    ``{"batch_size": 8}``)."""

    def agent_settings(self) -> dict[str, Any]:
        """The ILQL keyword arguments: :data:`ILQL_DEMO_AGENT`, ``agent``, and the seed.

        Raises:
            ValueError: a key of ``agent`` that :class:`rl_algos.ILQLConfig` does not have.
        """
        known = {f.name for f in fields(ILQLConfig)}
        unknown = sorted(set(self.agent) - known)
        if unknown:
            raise ValueError(
                f"ILQLDemoConfig.agent has keys ILQLConfig does not: {unknown} "
                f"(its fields: {', '.join(sorted(known))})"
            )
        return {**ILQL_DEMO_AGENT, **self.agent, "seed": self.seed}


def _shift(text: str) -> str:
    """Each digit and letter replaced by the next one (9 -> 0, z -> a): a systematic mistake."""
    out = []
    for ch in text:
        if ch.isdigit():
            out.append(str((int(ch) + 1) % 10))
        elif "a" <= ch <= "z":
            out.append(chr((ord(ch) - 97 + 1) % 26 + 97))
        else:
            out.append(ch)
    shifted = "".join(out)
    return shifted if shifted != text else text + "0"


def behaviour_dataset(
    questions: Sequence[str],
    answers: Sequence[str],
    reward: Callable[[str, str, str], float],
    *,
    p_correct: float,
    p_distractor: float,
    seed: int = 0,
) -> tuple[list[tuple[str, str]], list[float]]:
    """Log one answer per question from a scripted behaviour policy of mixed quality.

    With probability ``p_correct`` the answer is right; with ``p_distractor`` it is the
    systematic mistake (every character shifted by one); otherwise a random string of the
    answer's length over its character classes. Each is scored by ``reward(completion,
    answer, question)``.

    Returns:
        ``(samples, rewards)``: ``(question, completion)`` pairs and their rewards.
    """
    if p_correct < 0 or p_distractor < 0 or p_correct + p_distractor > 1:
        raise ValueError(
            f"need p_correct, p_distractor >= 0 with sum <= 1, got {p_correct}, {p_distractor}"
        )
    rng = random.Random(seed)
    samples: list[tuple[str, str]] = []
    rewards: list[float] = []
    for question, answer in zip(questions, answers, strict=True):
        u = rng.random()
        if u < p_correct:
            completion = answer
        elif u < p_correct + p_distractor:
            completion = _shift(answer)
        else:
            completion = "".join(
                rng.choice("0123456789" if ch.isdigit() else "abcdefghijklmnopqrstuvwxyz")
                for ch in answer
            )
        samples.append((question, completion))
        rewards.append(float(reward(completion, answer, question)))
    return samples, rewards


def run_ilql_demo(
    config: ILQLDemoConfig | None = None,
    run_dir: str | Path | None = None,
    *,
    verbose: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Log a behaviour dataset on a built-in task, train ILQL on it offline, report accuracy.

    ``verbose`` prints the summary lines, ``progress`` the loss every 25 steps.

    Returns:
        ``logged_reward`` (r0, the mean reward of the logged data), greedy accuracy and mean
        test reward of the language model alone (``decode_beta = 0``, i.e. the behaviour
        policy ILQL cloned) and of value-guided decoding, before and after training, the
        metrics history, and the agent.
    """
    cfg = config or ILQLDemoConfig()
    say = print if verbose else (lambda *a, **k: None)
    tokenizer = tiny_tokenizer()
    env = build_env(
        DemoConfig(task=cfg.task, n_train=cfg.n_train, n_test=cfg.n_test, seed=cfg.seed),
        tokenizer,
    )
    train, _ = train_test_split_task(cfg.task, cfg.n_train, cfg.n_test, seed=cfg.seed)
    samples, rewards = behaviour_dataset(
        train["question"], train["answer"], demo_reward,
        p_correct=cfg.p_correct, p_distractor=cfg.p_distractor, seed=cfg.seed,
    )  # fmt: skip
    dataset = make_experience(
        samples, rewards, tokenizer, max_length=cfg.agent_settings()["max_model_len"]
    )
    logged = float(dataset.raw_rewards.mean())
    model = tiny_model(len(tokenizer), seed=cfg.seed)
    agent = ILQL(
        actor_network=model,
        pad_token_id=tokenizer.pad_token_id,
        pad_token=tokenizer.pad_token,
        tokenizer=tokenizer,
        **cfg.agent_settings(),
    )

    def scores() -> dict[str, float]:
        out: dict[str, float] = {}
        beta = agent.decode_beta
        for name, b in (("lm", 0.0), ("guided", beta)):
            agent.decode_beta = b
            out[f"{name}_accuracy"] = greedy_accuracy(agent, env)
            out[f"{name}_reward"] = float(agent.test(env))
        agent.decode_beta = beta
        return out

    n_params = sum(p.numel() for p in model.parameters())
    say(
        f"rl-train demo: ilql on {cfg.task}, a {n_params:,}-parameter model built from scratch, "
        f"{cfg.steps} offline steps on CPU"
    )
    say(
        f"logged dataset: {len(dataset)} answers from a behaviour policy (right "
        f"{cfg.p_correct:.0%}, systematic mistake {cfg.p_distractor:.0%}, random otherwise); "
        f"mean reward r0 = {logged:.3f}"
    )
    before = scores()
    say(
        f"before training: greedy accuracy {before['lm_accuracy']:.2f}, value-guided accuracy "
        f"{before['guided_accuracy']:.2f}"
    )
    t0 = time.perf_counter()
    history = offline_learning_loop(
        agent,
        dataset,
        steps=cfg.steps,
        seed=cfg.seed,
        evaluation_interval=cfg.evaluation_interval,
        eval_fn=lambda a: {"eval_accuracy": greedy_accuracy(a, env)},
        run_dir=run_dir,
        checkpoint_steps=cfg.steps if run_dir is not None else None,
        verbose=verbose and progress,
        tensorboard=run_dir is not None,
        plot=run_dir is not None,
    )
    train_seconds = time.perf_counter() - t0
    after = scores()
    say(
        f"after training:  greedy accuracy {after['lm_accuracy']:.2f} (the cloned behaviour "
        f"policy), value-guided accuracy {after['guided_accuracy']:.2f} "
        f"(mean test reward {after['guided_reward']:.3f} vs r0 = {logged:.3f})"
    )
    summary = {
        "logged_reward": logged,
        "before": before,
        "after": after,
        "train_seconds": train_seconds,
        "history": history,
        "agent": agent,
    }
    if run_dir is not None:
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        resolved = {**asdict(cfg), "agent": cfg.agent_settings()}
        (out / "config.json").write_text(json.dumps(resolved, indent=2))
        (out / "summary.json").write_text(
            json.dumps(
                {"logged_reward": logged, "before": before, "after": after,
                 "train_seconds": train_seconds},
                indent=2,
            )
        )  # fmt: skip
        say(f"run directory: {out.resolve()}")
    if not math.isfinite(after["guided_reward"]):  # pragma: no cover - guarded by the agent
        raise FloatingPointError("value-guided evaluation returned a non-finite reward")
    return summary
