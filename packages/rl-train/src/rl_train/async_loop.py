"""Asynchronous training: a rollout worker samples while the trainer learns, staleness bounded.

:class:`AsyncReasoningSource` is a :class:`~rl_train.sources.Source` for
:func:`rl_train.loop.train_loop`. On its first step it starts the rollout worker
(:func:`rl_train.rollout_worker.worker_main`) in a spawned process with its own agent and
environment (built by the picklable ``factory``), sends it the actor's weights and the agent's
RNG state, and from then on each step:

1. takes the next :class:`~rl_train.rollout_worker.RolloutBatch` from the bounded queue,
   waiting at most ``timeout_s`` (a dead worker stops the run at once, naming it); a batch
   more than ``max_staleness`` versions old is dropped (``strategy="drop"``; with ``"wait"``
   the worker never samples one);
2. learns from its :class:`~rl_train.experience.Experience` with
   :func:`rl_train.experience.learn_from`, as the synchronous source does: the rollout carries
   the sampling log-probs, so the rollout-mismatch correction weights its tokens by
   ``pi_old / pi_sampler`` (the trainer's proximal log-probs against the behaviour policy's);
3. every ``weight_sync_steps`` updates, sends the actor's trainable tensors (LoRA: the
   adapter only) to the worker, which loads them through ``Engine.update_weights``, or, with
   ``engine_url``, into its model and on to the rollout server (LoRA: ``Engine.load_adapter``,
   the adapter's tensors in memory, each sample tagged with the version it was drawn with).

The policy version is the loop step (updates applied). With ``max_staleness=0`` the worker
samples batch ``s`` with version ``s`` and the seeds the synchronous loop draws, so the run is
the synchronous one, bit for bit on CPU. The checkpointed source state is the environment's
state after the last *consumed* batch plus ``policy_version``; a resumed run restarts the
worker from there.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rl_algos.distributed import deepspeed_plugin

from rl_train.config import ASYNC_REFUSED, AsyncConfig
from rl_train.experience import StepOutput, learn_from
from rl_train.rollout_worker import (
    RolloutBatch,
    RolloutPieces,
    StopWorker,
    WorkerFailed,
    WorkerStart,
    actor_named_parameters,
    weight_update,
    worker_main,
)
from rl_train.sources import REASONING_METRICS, MultiTurnSource

__all__ = ["ASYNC_METRICS", "AsyncReasoningSource", "RolloutWorkerError", "check_async_agent"]

#: The per-step metrics of the asynchronous loop.
ASYNC_METRICS = (
    "async_staleness_mean",
    "async_staleness_max",
    "async_dropped",
    "async_queue_depth",
    "async_worker_idle",
    "async_trainer_idle",
    "async_weight_sync_bytes",
)

#: The worker process's name (in errors and ``ps``).
WORKER_NAME = "rl-train-rollout-worker"


class RolloutWorkerError(RuntimeError):
    """The rollout worker died, failed or did not answer within the timeout."""


def check_async_agent(agents: Sequence[Any]) -> None:
    """Refuse what the asynchronous loop cannot train, with the fix.

    Raises:
        ValueError: a population, a critic (PPO) or a value-based agent (ILQL).
    """
    if len(agents) != 1:
        raise ValueError(
            f"async training takes one agent, got a population of {len(agents)}: train "
            "populations (evolution) with the synchronous loop (no async_config / async:)"
        )
    agent = agents[0]
    name = str(getattr(agent, "algo_name", ""))
    if name in ASYNC_REFUSED or getattr(agent, "uses_critic", False):
        reason = ASYNC_REFUSED.get(name, ASYNC_REFUSED["ppo"])
        raise ValueError(f"async_config: {reason}")
    if deepspeed_plugin(getattr(agent, "accelerator", None)) is not None:
        raise ValueError(
            "async training runs under DDP (each process with its own rollout worker) but not "
            "under DeepSpeed yet: drop deepspeed_config, or drop async_config / async:"
        )


def _drain(inbox: Any, timeout_s: float = 30.0) -> None:
    """Read what a gone worker left unread in ``inbox`` (closed) until its feeder thread ends.

    The queue's feeder thread writes the trainer's weight pushes into a pipe; once the worker
    is gone, nothing reads it, and a push larger than the pipe's buffer would hold the thread
    (and that copy of the weights) until the trainer exits. The pipe's read end and the thread
    are the queue's own (``_reader``, ``_thread``): without them there is nothing to do.
    """
    thread, reader = getattr(inbox, "_thread", None), getattr(inbox, "_reader", None)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(OSError, EOFError):
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            if reader is not None and reader.poll(0.05):
                reader.recv_bytes()
    if reader is not None and not (thread is not None and thread.is_alive()):
        with contextlib.suppress(OSError):
            reader.close()


class AsyncReasoningSource:
    """Batches from a rollout worker process, at most ``config.max_staleness`` versions old.

    Args:
        factory: Builds the worker's :class:`~rl_train.rollout_worker.RolloutPieces` (agent
            and ``ReasoningGym``, configured like the trainer's) in the worker process; it
            must be picklable (a module-level function or a ``functools.partial`` of one,
            e.g. ``functools.partial(rl_train.builder.rollout_pieces, run_config)``).
        config: The :class:`~rl_train.config.AsyncConfig`.
        episodes: Multi-turn episodes for the worker to play (its ``env_factory`` picklable)
            instead of the ``ReasoningGym``'s prompts; each step then learns from one batch of
            episodes as :class:`~rl_train.sources.MultiTurnSource` does (turn-level rewards,
            turn ids, sampling log-probs), and the factory's ``env`` may be None.
    """

    metric_keys: tuple[str, ...] | None = REASONING_METRICS + ASYNC_METRICS

    def __init__(
        self,
        factory: Callable[[], RolloutPieces],
        config: AsyncConfig,
        episodes: MultiTurnSource | None = None,
    ) -> None:
        for name, obj in (("rollout_factory", factory), ("env_factory", episodes)):
            try:
                pickle.dumps(obj)
            except Exception as exc:
                raise ValueError(
                    f"`{name}` must be picklable to reach the worker process: a "
                    "module-level function or functools.partial of one (not a lambda or a "
                    f"closure); pickling failed with {type(exc).__name__}: {exc}"
                ) from exc
        self.factory = factory
        self.config = config
        self.episodes = episodes
        self.process: Any = None
        self.inbox: Any = None
        self.outbox: Any = None
        self.env_state: dict[str, Any] | None = None
        self.version = 0
        self.dropped_total = 0
        self.last_end: float | None = None
        self.first = True
        self.named: list[tuple[str, torch.nn.Parameter]] | None = None

    # -- Source ----------------------------------------------------------------------------------

    def start(self, agents: Sequence[Any], state: dict[str, Any] | None) -> None:
        """Check the agent; remember a resumed run's environment state (the worker starts later)."""
        check_async_agent(agents)
        accelerator = getattr(agents[0], "accelerator", None)
        processes = getattr(accelerator, "num_processes", 1)
        lora = agents[0].policy.peft is not None
        if self.config.engine_url and lora and processes > 1 and self.config.max_staleness:
            raise ValueError(
                f"async.engine_url under DDP ({processes} processes) with max_staleness > 0: "
                "each process's worker pushes its adapter to the one server, and a worker a "
                "version ahead would have the others sample with its adapter; set "
                "async.max_staleness: 0, or drop async.engine_url (each worker's own engine)"
            )
        cfg = agents[0].config
        corrected = cfg.vllm_importance_sampling_correction or cfg.clip_against_sampler
        if self.config.max_staleness > 0 and not corrected:
            warnings.warn(
                "async training with max_staleness > 0, vllm_importance_sampling_correction="
                "False and clip_against_sampler=False learns from stale samples as if they "
                "were on-policy; set the agent's clip_against_sampler=True (recommended) or "
                "vllm_importance_sampling_correction=True",
                RuntimeWarning,
                stacklevel=2,
            )
        self.env_state = None
        if state is not None:
            self.env_state = {k: v for k, v in state.items() if k != "policy_version"}
        self.close()

    def step(self, agent: Any, index: int, step: int) -> StepOutput:
        """Learn from the next fresh-enough batch; push the weights when due."""
        del index
        if self.process is None:
            self._spawn(agent, step)
        t0 = time.perf_counter()
        dropped = 0
        while True:
            batch = self._receive(step)
            if step - batch.version <= self.config.max_staleness:
                break
            dropped += 1
        waited = time.perf_counter() - t0
        depth = self._depth()
        experience = batch.experience()
        agent._rng.setstate(batch.rng_state)  # the seeds drawn so far, as the sync loop's
        out = learn_from(agent, experience)
        self.env_state, self.version = batch.env_state, step + 1
        sent = 0
        if self.version % self.config.weight_sync_steps == 0:
            sent = self._push(agent, self.version)
        end = time.perf_counter()
        since = end - (self.last_end if self.last_end is not None else t0)
        self.last_end = end
        self.dropped_total += dropped
        staleness = float(step - batch.version)
        metrics = dict(out.metrics)
        metrics.update(
            async_staleness_mean=staleness,
            async_staleness_max=staleness,
            async_dropped=float(dropped),
            async_queue_depth=float(depth),
            async_worker_idle=batch.idle / batch.seconds if batch.seconds > 0 else 0.0,
            async_trainer_idle=waited / since if since > 0 else 0.0,
            async_weight_sync_bytes=float(sent),
        )
        return StepOutput(metrics, out.rewards)

    def state_dict(self) -> dict[str, Any] | None:
        """The environment's state after the last consumed batch, plus ``policy_version``."""
        if self.env_state is None:
            return None
        return {**self.env_state, "policy_version": self.version}

    def close(self) -> None:
        """Stop the worker (a stop message, then terminate/kill after a grace period)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.inbox.put(StopWorker())
            process.join(5.0)
        if process.is_alive():
            process.terminate()
            process.join(2.0)
        if process.is_alive():  # pragma: no cover - terminate is enough for our worker
            process.kill()
            process.join(2.0)
        for q in (self.inbox, self.outbox):
            q.cancel_join_thread()
            q.close()
        _drain(self.inbox)

    # -- the worker ------------------------------------------------------------------------------

    def _spawn(self, agent: Any, step: int) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self.inbox = ctx.Queue()
        self.outbox = ctx.Queue(maxsize=self.config.queue_size)
        start = WorkerStart(
            factory=self.factory,
            env_state=self.env_state,
            rng_state=agent._rng.getstate(),
            start_index=step,
            max_staleness=self.config.max_staleness,
            strategy=self.config.strategy,
            threads=self.config.worker_threads or torch.get_num_threads(),
            parent_pid=os.getpid(),
            timeout_s=self.config.timeout_s,
            episodes=self.episodes,
            engine_url=self.config.engine_url,
        )
        self.process = ctx.Process(
            target=worker_main,
            args=(start, self.inbox, self.outbox),
            name=WORKER_NAME,
            daemon=True,
        )
        self.process.start()
        self.first = True
        self.version = step
        self.named = actor_named_parameters(agent)  # looked up once: updates are in place
        self._push(agent, step)

    def _push(self, agent: Any, version: int) -> int:
        update = weight_update(agent, version, self.named)
        self.inbox.put(update)
        return update.tensor_bytes

    def _depth(self) -> int:
        try:
            return int(self.outbox.qsize())
        except NotImplementedError:  # pragma: no cover - macOS
            return -1

    def _receive(self, step: int) -> RolloutBatch:
        """The next message of the worker, or a :class:`RolloutWorkerError` within the timeout."""
        limit = self.config.startup_timeout_s if self.first else self.config.timeout_s
        deadline = time.monotonic() + limit
        process = self.process
        while True:
            try:
                message = self.outbox.get(timeout=0.2)
                break
            except queue.Empty:
                if not process.is_alive():
                    raise RolloutWorkerError(
                        f"the rollout worker ({WORKER_NAME}, pid {process.pid}) exited with "
                        f"code {process.exitcode} while the trainer waited for the batch of "
                        f"step {step + 1} (a negative code is the signal that killed it, e.g. "
                        "-9: SIGKILL, often out of memory); the run stopped. Check the "
                        "worker's output above, then continue from the last checkpoint with "
                        "train.resume=true (finetune_llm_reasoning(..., resume=True))"
                    ) from None
                if time.monotonic() > deadline:
                    raise RolloutWorkerError(
                        f"the rollout worker ({WORKER_NAME}, pid {process.pid}) sent no batch "
                        f"for {limit:g} s (step {step + 1}); it is alive but stuck or too "
                        "slow. Raise async.timeout_s (startup: async.startup_timeout_s), or "
                        "resume from the last checkpoint with train.resume=true"
                    ) from None
        self.first = False
        if isinstance(message, WorkerFailed):
            raise RolloutWorkerError(
                f"the rollout worker ({WORKER_NAME}, pid {process.pid}) failed; its "
                f"traceback:\n{message.error}"
            )
        assert isinstance(message, RolloutBatch)
        return message
