"""Sources feed the training loop: each step, one batch of experience per agent, learned from.

A source owns its data (the environment, the episodes, the logged samples). The online sources
act and learn through :mod:`rl_train.experience`: one flat :class:`rl_algos.Rollout` per step,
sampling log-probs included, so the rollout-mismatch correction runs when the agent asks for it
(``vllm_importance_sampling_correction``).

* :class:`ReasoningSource`: prompts of a :class:`rl_envs.ReasoningGym` (resumable);
* :class:`MultiTurnSource`: episodes of a :class:`rl_envs.SyncMultiTurnVecEnv`;
* :class:`OfflineSource`: minibatches of a logged :class:`~rl_train.offline.OfflineDataset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from rl_algos.batch import Rollout, first_actions
from rl_envs import SyncMultiTurnVecEnv

from rl_train.experience import Experience, StepOutput, collect, learn_from
from rl_train.offline import OfflineDataset

__all__ = [
    "REASONING_METRICS",
    "MultiTurnSource",
    "OfflineSource",
    "ReasoningSource",
    "Source",
    "StepOutput",
]

#: The ``learn`` metrics the online loops log (means over the population).
REASONING_METRICS = (
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "grad_norm",
    "value_loss",
    "kept_groups",
)


class Source(Protocol):
    """What :func:`rl_train.loop.train_loop` needs from a data source."""

    metric_keys: tuple[str, ...] | None
    """The ``learn`` metrics to log (None: all of them)."""

    def start(self, agents: Sequence[Any], state: dict[str, Any] | None) -> None:
        """Begin (``state`` None) or continue from a :meth:`state_dict` (a resumed run)."""

    def step(self, agent: Any, index: int, step: int) -> StepOutput:
        """Collect a batch for ``agent`` (population member ``index``) at loop ``step``; learn."""

    def state_dict(self) -> dict[str, Any] | None:
        """The iteration state written with each checkpoint (None: not resumable)."""


class ReasoningSource:
    """Prompts of a ``ReasoningGym``: ``get_action`` -> ``env.step`` -> ``learn``.

    After each update the reference policy follows the actor once per dataset pass
    (``set_reference_policy(env.num_epochs)``) and the batch's mean reward is appended to
    ``agent.scores``.

    Args:
        env: A :class:`rl_envs.ReasoningGym` (or anything with its ``reset`` / ``step``).
    """

    metric_keys: tuple[str, ...] | None = REASONING_METRICS

    def __init__(self, env: Any) -> None:
        self.env = env
        self.prompts: Any = None

    def start(self, agents: Sequence[Any], state: dict[str, Any] | None) -> None:
        """Reset the data loaders, or restore the iteration state of a checkpoint."""
        del agents
        self.prompts = None
        if state is not None and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(state)
            self.prompts = self.env.current_batch
        if self.prompts is None:
            self.prompts = self.env.reset(reset_dataloaders=True)

    def step(self, agent: Any, index: int, step: int) -> StepOutput:
        """One batch of prompts for ``agent``; returns its ``learn`` metrics and rewards."""
        del index, step
        experience, self.prompts = collect(agent, self.env, self.prompts)
        return learn_from(agent, experience)

    def state_dict(self) -> dict[str, Any] | None:
        """The environment's iteration state (cursor, pending batch), if it has one."""
        return self.env.state_dict() if hasattr(self.env, "state_dict") else None


class MultiTurnSource:
    """Episodes of ``env_factory()`` run to their end with the agent's sampling.

    Each step runs ``batch_size`` tasks x ``group_size`` copies (default: the agent's
    ``group_size`` if it has one, else 1), then calls ``learn`` with per-turn rewards [N, K],
    ``turn_ids`` and the sampling log-probs of every generated token.

    Args:
        env_factory: Builds one :class:`rl_envs.TokenObservationWrapper`.
        max_turns: The wrapper's ``max_turns`` (checked).
        batch_size: Tasks per step.
        group_size: Copies per task (None: the agent's ``group_size`` or 1).
        seed: Seed of the first step's tasks (step ``s`` of agent ``k`` uses
            ``seed + s * len(population) + k``).
    """

    metric_keys: tuple[str, ...] | None = REASONING_METRICS

    def __init__(
        self,
        env_factory: Callable[[], Any],
        max_turns: int,
        *,
        batch_size: int = 2,
        group_size: int | None = None,
        seed: int = 0,
    ) -> None:
        self.env_factory = env_factory
        self.max_turns = max_turns
        self.batch_size = batch_size
        self.group_size = group_size
        self.seed = seed
        self.population = 1

    def start(self, agents: Sequence[Any], state: dict[str, Any] | None) -> None:
        """Remember the population size (episodes are seeded per step and agent)."""
        del state
        self.population = len(agents)

    def step(self, agent: Any, index: int, step: int) -> StepOutput:
        """Roll out one batch of episodes for ``agent`` and learn from them."""
        return learn_from(agent, self.rollout(agent, index, step))

    def rollout(self, agent: Any, index: int, step: int) -> Experience:
        """The batch of episodes of population member ``index`` at loop ``step`` (no update).

        The asynchronous loop's rollout worker calls this with its own copy of the agent.
        """
        G = self.group_size or int(getattr(agent, "group_size", 1))
        vec = SyncMultiTurnVecEnv(self.env_factory, batch_size=self.batch_size, group_size=G)
        recorder = _TurnRecorder(agent, vec)
        batch = vec.rollout(recorder, seed=self.seed + step * self.population + index)
        if batch.turn_rewards.shape[1] != self.max_turns:
            raise ValueError(
                f"`max_turns`={self.max_turns} differs from the wrapper's "
                f"{batch.turn_rewards.shape[1]}"
            )
        sampling = recorder.aligned(batch.turn_ids)
        mask = batch.action_mask[:, 1:].bool()  # shifted by one, as every [N, T] tensor
        rollout = Rollout(
            input_ids=batch.input_ids.long(),
            mask=mask,
            prompt_lengths=first_actions(mask),
            group_size=G,
            sampling_logprobs=None if sampling is None else sampling[:, 1:],
            rewards=batch.turn_rewards,
            turn_ids=batch.turn_ids[:, 1:],
        )
        return Experience(rollout, batch.returns, None)

    def state_dict(self) -> dict[str, Any] | None:
        """None: episodes are drawn from seeds, there is no cursor to keep."""
        return None


class _TurnRecorder:
    """The policy of a multi-turn rollout; keeps each turn's sampling log-probs per episode."""

    def __init__(self, agent: Any, vec: SyncMultiTurnVecEnv) -> None:
        self.agent = agent
        self.vec = vec
        self.turns: list[list[torch.Tensor | None]] = [[] for _ in range(vec.num_envs)]

    def __call__(self, obs: list[dict[str, Any]]) -> list[torch.Tensor]:
        active = [i for i, a in enumerate(self.vec.active) if a]
        result = self.agent.get_action(obs, training=True, repeat_prompts=False)
        completions, _, logps = result.rollout.blocks()  # one row per observation
        actions = []
        for j, (c, o) in enumerate(zip(completions, obs, strict=True)):
            P = o["input_ids"].shape[1]
            actions.append(c[0, P:])
            self.turns[active[j]].append(None if logps is None else logps[j][0, P - 1 :])
        return actions

    def aligned(self, turn_ids: torch.Tensor) -> torch.Tensor | None:
        """[N, L] sampling log-probs at the generated tokens (0 elsewhere), or None.

        The wrapper keeps a prefix of each action (cut after EOS or before trailing padding),
        so turn ``k``'s tokens take the first log-probs recorded for that turn.
        """
        out = torch.zeros(turn_ids.shape, dtype=torch.float32)
        for n, turns in enumerate(self.turns):
            for k, lp in enumerate(turns):
                if lp is None:
                    return None
                where = (turn_ids[n] == k).nonzero().flatten()
                out[n, where] = lp[: where.numel()].float().cpu()
        return out


def _check_rows(batch_size: Any, rows: int, name: str) -> int:
    """``batch_size`` as rows per offline step: an int in [1, rows] (the dataset's rows)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{name} must be an int >= 1 (rows per step), got {batch_size!r}")
    if batch_size > rows:
        raise ValueError(
            f"{name} is {batch_size} but the dataset has {rows} rows: every step would learn "
            f"on fewer rows than asked; pass batch_size <= {rows} or log more samples"
        )
    return batch_size


class OfflineSource:
    """Minibatches of a logged dataset, in a seeded shuffle reshuffled every pass.

    A pass's last rows that do not fill a batch are skipped (like the last partial batch of
    ``ReasoningGym``'s training split). No generation: ``learn`` gets the logged tokens.

    Args:
        dataset: The :class:`~rl_train.offline.OfflineDataset`.
        batch_size: Rows per step, at most the dataset's (None: the agent's ``batch_size``, or
            the whole dataset when it has fewer rows).
        seed: Seed of the shuffles.
    """

    metric_keys: tuple[str, ...] | None = None

    def __init__(
        self, dataset: OfflineDataset, batch_size: int | None = None, seed: int = 0
    ) -> None:
        if len(dataset) == 0:
            raise ValueError("`dataset` is empty: build it with make_experience(samples, rewards)")
        if batch_size is not None:
            _check_rows(batch_size, len(dataset), "`batch_size`")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.size = 0
        self.generator = torch.Generator()
        self.order = torch.arange(0)
        self.cursor = 0

    def start(self, agents: Sequence[Any], state: dict[str, Any] | None) -> None:
        """The first shuffle (``batch_size`` defaults to the first agent's)."""
        del state
        rows = len(self.dataset)  # the agent's batch, at most the dataset (trlX's last batch)
        self.size = self.batch_size or min(rows, int(agents[0].batch_size))
        self.generator.manual_seed(self.seed)
        self.order = torch.randperm(len(self.dataset), generator=self.generator)
        self.cursor = 0

    def step(self, agent: Any, index: int, step: int) -> StepOutput:
        """``agent.learn`` on the next ``batch_size`` rows."""
        del index, step
        n = len(self.dataset)
        if self.cursor + self.size > n and self.cursor > 0:
            self.order, self.cursor = torch.randperm(n, generator=self.generator), 0
        rows = self.order[self.cursor : self.cursor + self.size].sort().values
        self.cursor += self.size
        metrics = agent.learn(self.dataset.batch(rows))
        return StepOutput({k: float(v) for k, v in metrics.items()}, None)

    def state_dict(self) -> dict[str, Any] | None:
        """None: offline runs restart their shuffle."""
        return None
