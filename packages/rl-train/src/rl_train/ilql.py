r"""Offline ILQL training (trlX-style): ``(samples, rewards)`` in, a value-guided policy out.

trlX trains ILQL with ``trlx.train(samples=..., rewards=..., eval_prompts=..., config=...)``:
the trainer's ``make_experience(samples, rewards, max_length)`` tokenises the samples, puts each
(standardised) reward on the sample's last token, and ``learn()`` fits the ILQL heads on that
fixed dataset with no generation (Snell et al., arXiv 2206.11871). Here:

* :func:`make_experience`: samples (a string, or alternating ``(prompt, output, ...)``
  strings) and rewards to an :class:`OfflineDataset` (``[N, L]`` ids, ``[N, L - 1]`` action
  masks over the outputs, ``[N]`` rewards), with errors that name the argument and the fix;
* :class:`ILQLTrainer`, registered as ``"ilql"`` (``make_trainer(config)`` with
  ``config.algo == "ilql"``): ``make_experience`` then ``learn`` (minibatches of the dataset,
  metrics, evaluations, checkpoints), ``evaluate`` with value-guided greedy decoding;
* :func:`train_offline`: the one-call entry point, trlX's ``train`` for ILQL;
* :func:`offline_learning_loop`: the loop itself, for any :class:`rl_algos.ILQL`;
* :func:`behaviour_dataset` and :func:`run_ilql_demo`: ``rl-train demo --algo ilql`` logs a
  mixed-quality dataset from a scripted behaviour policy on a built-in task, trains ILQL on it
  offline and reports the accuracy before and after.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rl_train.config import RunConfig, load_config
from rl_train.metrics import MetricsLogger
from rl_train.trainer import AgentTrainer, BaseRLTrainer, register_trainer

__all__ = [
    "ILQLDemoConfig",
    "ILQLTrainer",
    "OfflineDataset",
    "behaviour_dataset",
    "make_experience",
    "offline_learning_loop",
    "run_ilql_demo",
    "train_offline",
]

Sample = str | Sequence[str]


# -- data ----------------------------------------------------------------------------------------


@dataclass
class OfflineDataset:
    """A tokenised offline dataset (``N`` samples, ``L`` tokens)."""

    input_ids: torch.Tensor
    """[N, L] long, right-padded with the pad id."""
    action_masks: torch.Tensor
    """[N, L - 1] bool: True where token t + 1 belongs to an output (an action)."""
    rewards: torch.Tensor
    """[N] float32 rewards as learned from (standardised unless ``normalize_rewards=False``);
    the agent puts each on its sample's last action token."""
    raw_rewards: torch.Tensor
    """[N] float32 rewards as given."""
    lengths: torch.Tensor
    """[N] long, tokens of each sample."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(completion_ids, action_masks, rewards)`` of ``rows`` for ``ILQL.learn``.

        The tensors are trimmed to the longest of these rows.
        """
        width = int(self.lengths[rows].max())
        return (
            self.input_ids[rows, :width],
            self.action_masks[rows, : width - 1],
            self.rewards[rows],
        )


def _segments(i: int, sample: Any, bos: str | None) -> list[str]:
    if isinstance(sample, str):
        if bos is None:
            raise ValueError(
                f"`samples`[{i}] is a plain string, which ILQL treats as one output after a BOS "
                "token, but the tokenizer has no bos_token: pass (prompt, output) pairs instead"
            )
        return [bos, sample]
    parts = list(sample)
    if len(parts) < 2 or len(parts) % 2 or not all(isinstance(p, str) for p in parts):
        raise ValueError(
            f"`samples`[{i}] must be a string or an even number of strings alternating prompt "
            f"and output, e.g. (prompt, output); got {sample!r}"
        )
    return parts


def make_experience(
    samples: Sequence[Sample],
    rewards: Sequence[float] | torch.Tensor | None,
    tokenizer: Any,
    max_length: int = 2048,
    *,
    normalize_rewards: bool = True,
    append_eos: bool = True,
) -> OfflineDataset:
    """Tokenise offline samples and shape their rewards (trlX's ``make_experience``).

    A sample is a string (all of it is output, conditioned on the BOS token, as trlX does) or
    alternating ``(prompt, output, prompt, output, ...)`` strings; output tokens are the
    actions. The EOS token is appended to the last output (``append_eos``) so the policy
    learns to stop. Samples longer than ``max_length`` tokens keep their last ``max_length``
    tokens. Rewards are standardised over the dataset, ``(r - mean) / std`` (trlX), unless
    ``normalize_rewards=False``; a constant reward leaves nothing to learn and warns.

    Args:
        samples: ``N`` samples.
        rewards: ``N`` finite scalar rewards, one per sample.
        tokenizer: A Hugging Face tokenizer with a pad token (and EOS for ``append_eos``).
        max_length: Most tokens kept per sample (>= 2).
        normalize_rewards: Standardise the rewards.
        append_eos: End the last output with EOS (unless it already does).

    Returns:
        An :class:`OfflineDataset`.

    Raises:
        ValueError: empty ``samples``, missing / mismatched / non-finite ``rewards``, a
            malformed sample, or a sample with no output token; the message names the
            argument and the fix.
    """
    r = _check_rewards(samples, rewards)
    if max_length < 2:
        raise ValueError(
            f"`max_length` must be >= 2 (a prompt token and an action), got {max_length}"
        )
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs a pad token (set tokenizer.pad_token)")
    if append_eos and tokenizer.eos_token_id is None:
        raise ValueError("`append_eos=True` needs a tokenizer with an eos token")
    rows: list[list[int]] = []
    acts: list[list[bool]] = []
    for i, sample in enumerate(samples):
        ids, is_action = _tokenize(i, sample, tokenizer, append_eos)
        ids, is_action = ids[-max_length:], is_action[-max_length:]
        rows.append(ids)
        acts.append(is_action[1:])
    L = max(len(x) for x in rows)
    input_ids = torch.full((len(rows), L), int(tokenizer.pad_token_id), dtype=torch.long)
    masks = torch.zeros((len(rows), L - 1), dtype=torch.bool)
    for n, (ids, act) in enumerate(zip(rows, acts, strict=True)):
        input_ids[n, : len(ids)] = torch.tensor(ids)
        masks[n, : len(act)] = torch.tensor(act, dtype=torch.bool)
    shaped = _standardise(r) if normalize_rewards else r.clone()
    lengths = torch.tensor([len(x) for x in rows], dtype=torch.long)
    return OfflineDataset(input_ids, masks, shaped, r, lengths)


def _check_rewards(samples: Sequence[Sample], rewards: Any) -> torch.Tensor:
    if rewards is None:
        raise ValueError(
            "`rewards` is None: ILQL learns from (sample, reward) pairs; pass one reward per "
            "sample (for samples without rewards use supervised fine-tuning)"
        )
    if len(samples) == 0:
        raise ValueError("`samples` is empty: pass at least one sample and its reward")
    r = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)
    if r.numel() != len(samples):
        raise ValueError(
            f"`samples` has {len(samples)} items but `rewards` has {r.numel()}: pass exactly "
            "one reward per sample"
        )
    bad = (~torch.isfinite(r)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"`rewards` has NaN or inf at index {bad[:5]} (value {float(r[bad[0]])}): fix the "
            "reward function or drop those samples"
        )
    return r


def _tokenize(
    i: int, sample: Any, tokenizer: Any, append_eos: bool
) -> tuple[list[int], list[bool]]:
    """Token ids of a sample and, per token, whether it is an output (action) token."""
    bos = tokenizer.bos_token if tokenizer.bos_token_id is not None else None
    eos = tokenizer.eos_token_id
    parts = _segments(i, sample, bos)
    ids: list[int] = []
    is_action: list[bool] = []
    for k, text in enumerate(parts):
        if k == 0 and isinstance(sample, str):
            piece = [int(tokenizer.bos_token_id)]
        else:
            piece = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        if k == len(parts) - 1 and append_eos and (not piece or piece[-1] != eos):
            piece.append(int(eos))
        ids += piece
        is_action += [k % 2 == 1] * len(piece)
    if not any(is_action[1:]):
        raise ValueError(
            f"`samples`[{i}] has no output token to learn from (after a prompt token): give it "
            "a non-empty output or drop it"
        )
    if is_action[0]:
        raise ValueError(f"`samples`[{i}] needs a non-empty prompt before its first output")
    return ids, is_action


def _standardise(r: torch.Tensor) -> torch.Tensor:
    """``(r - mean) / std`` over the dataset (trlX); a constant reward becomes 0, with a warning."""
    std = float(r.std(unbiased=False))
    if std == 0.0:
        warnings.warn(
            "every reward is the same: after standardisation they are all 0 and ILQL has "
            "nothing to learn (pass normalize_rewards=False to keep them)",
            RuntimeWarning,
            stacklevel=3,
        )
    return (r - r.mean()) / (std if std > 0 else 1.0)


# -- the loop ------------------------------------------------------------------------------------


def offline_learning_loop(
    agent: Any,
    dataset: OfflineDataset,
    *,
    steps: int,
    batch_size: int | None = None,
    seed: int = 0,
    evaluation_interval: int | None = None,
    eval_fn: Callable[[Any], dict[str, float]] | None = None,
    run_dir: str | Path | None = None,
    checkpoint_steps: int | None = None,
    log_fn: Callable[[dict[str, float]], None] | None = None,
    save_fn: Callable[[Path], None] | None = None,
    tensorboard: bool = False,
    verbose: bool = False,
) -> list[dict[str, float]]:
    """Train ``agent`` (an :class:`rl_algos.ILQL`) on ``dataset`` for ``steps`` steps.

    Each step is ``agent.learn`` on the next ``batch_size`` rows (default the agent's) of a
    seeded shuffle of the dataset, reshuffled every pass (a pass's last rows that do not fill a
    batch are skipped, like the last partial batch of ``ReasoningGym``'s training split).
    Every ``evaluation_interval`` steps (and after the last) ``eval_fn(agent)`` is added to the
    step's row. Rows go to
    ``run_dir``'s ``metrics.jsonl`` / ``metrics.csv`` when ``run_dir`` is given, and to
    ``log_fn``; every ``checkpoint_steps`` steps the agent is saved to
    ``run_dir/checkpoints/step_<n>/agent_0`` (the layout ``rl-train eval`` reads).

    Returns:
        The metrics rows, one per step.
    """
    from rl_train.loops import _save

    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    if len(dataset) == 0:
        raise ValueError("`dataset` is empty: build it with make_experience(samples, rewards)")
    size = batch_size or int(agent.batch_size)
    gen = torch.Generator().manual_seed(seed)
    logger = MetricsLogger(run_dir, tensorboard=tensorboard) if run_dir is not None else None
    order = torch.randperm(len(dataset), generator=gen)
    cursor = 0
    history: list[dict[str, float]] = []
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            if cursor + size > len(dataset) and cursor > 0:
                order, cursor = torch.randperm(len(dataset), generator=gen), 0
            rows = order[cursor : cursor + size].sort().values
            cursor += size
            metrics = agent.learn(dataset.batch(rows))
            row = {k: float(v) for k, v in metrics.items()}
            row["step_time"] = time.perf_counter() - t0
            if eval_fn is not None and (
                (evaluation_interval and step % evaluation_interval == 0) or step == steps
            ):
                row.update(eval_fn(agent))
            history.append(row)
            if logger is not None:
                logger.log(step, row)
            if log_fn is not None:
                log_fn({"step": step, **row})
            if verbose and (step % 25 == 0 or step == steps):
                print(f"step {step}/{steps}: loss {row['loss']:.4f}", flush=True)
            if run_dir is not None and checkpoint_steps and step % checkpoint_steps == 0:
                saved = _save(Path(run_dir), step, [agent], None)
                if save_fn is not None:
                    save_fn(saved)
    finally:
        if logger is not None:
            logger.close()
    return history


# -- the trainer ---------------------------------------------------------------------------------


@register_trainer("ilql")
class ILQLTrainer(AgentTrainer):
    """trlX's ``AccelerateILQLTrainer``: offline ILQL on ``(samples, rewards)``.

    Built from a :class:`~rl_train.config.RunConfig` with ``algo: ilql`` (model, evaluation
    data and ``agent`` arguments of :class:`rl_algos.ILQL`); :meth:`make_experience` stores the
    dataset, :meth:`learn` trains on it for ``train.steps`` steps of ``agent.batch_size`` rows
    with evaluations, metrics and checkpoints in ``train.run_dir``. :meth:`evaluate` decodes
    value-guided and greedy, on the ``eval_prompts`` (scored by ``reward_fn`` /
    ``metric_fn``) or else on the config's test split.
    """

    def setup(self) -> None:
        """Build model, tokenizer, evaluation data and the ILQL agent from the config."""
        super().setup()
        self.store: OfflineDataset | None = None
        self.eval_prompts: list[str] | None = None

    def make_experience(
        self,
        samples: Sequence[Sample],
        rewards: Sequence[float] | torch.Tensor | None,
        max_length: int = 2048,
        normalize_rewards: bool = True,
    ) -> OfflineDataset:
        """Tokenise ``samples``, shape ``rewards`` and store them (see :func:`make_experience`)."""
        self.store = make_experience(
            samples, rewards, self.tokenizer, max_length, normalize_rewards=normalize_rewards
        )
        return self.store

    def add_eval_prompts(self, prompts: Sequence[str]) -> None:
        """Evaluate on these prompts (scored by ``reward_fn`` / ``metric_fn``)."""
        if not prompts:
            raise ValueError("`eval_prompts` is empty: pass at least one prompt or None")
        self.eval_prompts = [str(p) for p in prompts]

    def learn(
        self,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
        save_fn: Callable[[Any], None] | None = None,
        eval_fn: Callable[[BaseRLTrainer], dict[str, float] | None] | None = None,
    ) -> None:
        """Train on the stored dataset (call :meth:`make_experience` first)."""
        if self.store is None:
            raise ValueError(
                "no offline data: call trainer.make_experience(samples, rewards) before learn()"
            )
        t = self.config.train

        def evaluation(_: Any) -> dict[str, float]:
            stats = self.evaluate(show=False)
            if eval_fn is not None:
                stats.update(eval_fn(self) or {})
            return stats

        offline_learning_loop(
            self.agent,
            self.store,
            steps=t.steps,
            seed=t.seed,
            evaluation_interval=t.evaluation_interval,
            eval_fn=evaluation,
            run_dir=t.run_dir,
            checkpoint_steps=t.checkpoint_steps,
            log_fn=log_fn,
            save_fn=save_fn,
        )

    def evaluate(self, show: bool = True) -> dict[str, float]:
        """Value-guided greedy samples on the eval prompts (or the test split); mean reward."""
        if self.eval_prompts is None:
            return super().evaluate(show)
        prompts = [
            {"input_ids": torch.tensor([self.tokenizer.encode(p, add_special_tokens=False)])}
            for p in self.eval_prompts
        ]
        result = self.agent.get_action(prompts, training=False)
        sizes = [int(p["input_ids"].shape[1]) for p in prompts]
        samples, str_prompts, outputs = self.decode(
            [p["input_ids"][0].tolist() for p in prompts],
            [c[0].tolist() for c in result.completion_ids],
            sizes,
        )
        stats: dict[str, float] = {}
        if self.reward_fn is not None:
            scores = self.reward_fn(samples=samples, prompts=str_prompts, outputs=outputs)
            stats["reward/mean"] = sum(float(s) for s in scores) / len(scores)
        if self.metric_fn is not None:
            for k, v in self.metric_fn(
                samples=samples, prompts=str_prompts, outputs=outputs
            ).items():
                stats[f"metrics/{k}"] = sum(float(x) for x in v) / max(1, len(v))
        if show:
            for prompt, output in list(zip(str_prompts, outputs, strict=True))[:8]:
                print(f"{prompt[-30:]!r:<30} | {output[:20]!r}")
            print(", ".join(f"{k}={v:.3f}" for k, v in stats.items()))
        return stats


def train_offline(
    samples: Sequence[Sample],
    rewards: Sequence[float] | torch.Tensor | None,
    *,
    config: RunConfig | None = None,
    eval_prompts: Sequence[str] | None = None,
    reward_fn: Callable[..., Sequence[float]] | None = None,
    metric_fn: Callable[..., dict[str, Sequence[float]]] | None = None,
    max_length: int = 2048,
    stop_sequences: Sequence[str] | None = None,
    log_fn: Callable[[dict[str, Any]], None] | None = None,
) -> ILQLTrainer:
    """The one-call entry point, trlX's ``trlx.train(samples=..., rewards=...)`` for ILQL.

    Builds the ``"ilql"`` trainer (default config: the embedded tiny model), stores the
    experience, trains, and returns the trainer (``trainer.agent`` is the
    :class:`rl_algos.ILQL`; ``trainer.evaluate()``, ``trainer.save_pretrained()``).

    Args:
        samples: Offline samples (see :func:`make_experience`).
        rewards: One reward per sample.
        config: A :class:`RunConfig` (its ``algo`` is set to ``"ilql"``).
        eval_prompts: Prompts to evaluate on (scored by ``reward_fn`` / ``metric_fn``).
        reward_fn: ``reward_fn(samples, prompts, outputs, **kwargs) -> list[float]`` for the
            evaluations (it also scores the config's test split when ``eval_prompts`` is None).
        metric_fn: ``metric_fn(samples, prompts, outputs, **kwargs) -> dict[str, list]``.
        max_length: Most tokens per sample.
        stop_sequences: Strings that end a decoded output.
        log_fn: Called with each step's metrics.
    """
    cfg = config if config is not None else load_config(None, ["algo=ilql"])
    cfg.algo = "ilql"
    trainer = ILQLTrainer(
        cfg, reward_fn=reward_fn, metric_fn=metric_fn, stop_sequences=stop_sequences
    )
    if eval_prompts is not None:
        trainer.add_eval_prompts(eval_prompts)
    trainer.make_experience(samples, rewards, max_length)
    trainer.learn(log_fn=log_fn)
    return trainer


# -- the demo ------------------------------------------------------------------------------------


@dataclass
class ILQLDemoConfig:
    """Settings of ``rl-train demo --algo ilql`` (and of the integration test)."""

    task: str = "successor_digit"
    """A built-in task of :mod:`rl_envs.tasks`."""
    steps: int = 300
    """Optimizer steps on the logged dataset."""
    batch_size: int = 32
    """Samples per step."""
    lr: float = 1e-3
    """Learning rate (full fine-tuning of the tiny model and the heads)."""
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
    gamma: float = 0.99
    """Discount."""
    tau: float = 0.7
    """Expectile."""
    cql_scale: float = 0.1
    """CQL weight."""
    awac_scale: float = 1.0
    """Weight of the LM (behaviour cloning) term."""
    alpha: float = 0.1
    """Polyak rate of the target Q heads (trlX's 0.001 is for runs of many thousand steps)."""
    steps_for_target_q_sync: int = 1
    """Steps between target updates."""
    decode_beta: float = 4.0
    """Guidance strength of value-guided decoding."""
    evaluation_interval: int = 50
    """Steps between evaluations."""
    max_output_tokens: int = 2
    """Generated tokens per answer."""


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
    import json

    from rl_algos import ILQL

    from rl_train.demo import (
        DemoConfig,
        build_env,
        demo_reward,
        greedy_accuracy,
        tiny_model,
        tiny_tokenizer,
    )

    cfg = config or ILQLDemoConfig()
    say = print if verbose else (lambda *a, **k: None)
    tokenizer = tiny_tokenizer()
    env = build_env(
        DemoConfig(task=cfg.task, n_train=cfg.n_train, n_test=cfg.n_test, seed=cfg.seed),
        tokenizer,
    )
    from rl_envs.tasks import train_test_split_task

    train, _ = train_test_split_task(cfg.task, cfg.n_train, cfg.n_test, seed=cfg.seed)
    samples, rewards = behaviour_dataset(
        train["question"], train["answer"], demo_reward,
        p_correct=cfg.p_correct, p_distractor=cfg.p_distractor, seed=cfg.seed,
    )  # fmt: skip
    dataset = make_experience(samples, rewards, tokenizer, max_length=64)
    logged = float(dataset.raw_rewards.mean())
    model = tiny_model(len(tokenizer), seed=cfg.seed)
    agent = ILQL(
        actor_network=model,
        pad_token_id=tokenizer.pad_token_id,
        pad_token=tokenizer.pad_token,
        tokenizer=tokenizer,
        full_finetune=True,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        max_grad_norm=1.0,
        max_output_tokens=cfg.max_output_tokens,
        max_model_len=64,
        seed=cfg.seed,
        gamma=cfg.gamma,
        tau=cfg.tau,
        cql_scale=cfg.cql_scale,
        awac_scale=cfg.awac_scale,
        alpha=cfg.alpha,
        steps_for_target_q_sync=cfg.steps_for_target_q_sync,
        decode_beta=cfg.decode_beta,
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
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
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
