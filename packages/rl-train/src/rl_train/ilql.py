r"""Offline ILQL training (trlX-style): ``(samples, rewards)`` in, a value-guided policy out.

trlX trains ILQL with ``trlx.train(samples=..., rewards=..., eval_prompts=..., config=...)``:
the trainer's ``make_experience(samples, rewards, max_length)`` tokenises the samples, puts each
(standardised) reward on the sample's last token, and ``learn()`` fits the ILQL heads on that
fixed dataset with no generation (Snell et al., arXiv 2206.11871). Here:

* :func:`~rl_train.offline.make_experience` (re-exported): samples and rewards to an
  :class:`~rl_train.offline.OfflineDataset`;
* :class:`ILQLTrainer`, the ``trainer`` of the ``ilql`` row of the algorithm table
  (``make_trainer(config)`` with ``config.algo == "ilql"``):
  ``make_experience`` then ``learn`` (minibatches of the dataset, metrics, evaluations,
  checkpoints), ``evaluate`` with value-guided greedy decoding;
* :func:`train_offline`: the one-call entry point, trlX's ``train`` for ILQL;
* :func:`~rl_train.loops.offline_learning_loop` (re-exported): the loop, for any
  :class:`rl_algos.ILQL`.

``rl-train demo --algo ilql`` lives in :mod:`rl_train.ilql_demo`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from rl_algos.names import ALGORITHM_SPECS, ALGORITHMS

from rl_train.config import RunConfig, load_config
from rl_train.loops import offline_learning_loop
from rl_train.offline import OfflineDataset, Sample, make_experience
from rl_train.trainer import AgentTrainer, BaseRLTrainer

__all__ = [
    "OFFLINE_ALGORITHMS",
    "ILQLTrainer",
    "OfflineDataset",
    "make_experience",
    "offline_learning_loop",
    "train_offline",
]

#: The built-in algorithms that learn from logged data (rows whose ``trainer`` is this module's).
OFFLINE_ALGORITHMS = tuple(name for name in ALGORITHMS if not ALGORITHM_SPECS[name].online)


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
