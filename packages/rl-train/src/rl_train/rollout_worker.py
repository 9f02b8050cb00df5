"""The rollout worker of the asynchronous loop: its own process, model copy and environment.

The trainer (:class:`rl_train.async_loop.AsyncReasoningSource`) starts :func:`worker_main` in a
spawned process. The worker builds its own agent and environment with a picklable factory
(:class:`RolloutPieces`), then repeats: take the newest weights the trainer sent
(:class:`WeightUpdate`; with ``strategy="wait"`` it first waits until they are at most
``max_staleness`` versions behind the batch it is about to sample), collect one
:class:`~rl_train.experience.Experience` (:func:`rl_train.experience.collect`: ``get_action``
on the pending prompts, ``env.step`` for the rewards and the next prompts), and put it as a
:class:`RolloutBatch` tagged with the policy version into the bounded queue. With
:attr:`WorkerStart.episodes` (a :class:`~rl_train.sources.MultiTurnSource`) the experience is
instead that source's multi-turn episodes of the step, played to their end with the worker's
agent.

Everything crossing the process boundary is a frozen dataclass; tensors travel as pickled
bytes, each list of tensors packed into one flat buffer (:class:`Packed`): no shared-memory
handles that die with their sender, and one storage to copy per kind. The sampling seed
of each batch comes from the worker agent's RNG, which starts as the trainer agent's, so with
``max_staleness=0`` the worker draws exactly the seeds the synchronous loop would. The worker
exits when the trainer sends :class:`StopWorker`, when its parent dies (``PR_SET_PDEATHSIG``
on Linux, and a parent-pid check while it waits) and after any error, which it reports as
:class:`WorkerFailed` first.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from rl_algos.batch import Rollout

from rl_train.experience import Experience, collect
from rl_train.sources import MultiTurnSource

__all__ = [
    "RolloutBatch",
    "RolloutPieces",
    "StopWorker",
    "WeightUpdate",
    "WorkerFailed",
    "WorkerStart",
    "actor_named_parameters",
    "actor_tensors",
    "apply_weights",
    "encode_experience",
    "weight_update",
    "worker_main",
]

#: Seconds between checks of the parent and the inbox while the worker waits.
POLL_S = 0.2


@dataclass(frozen=True)
class RolloutPieces:
    """What the worker samples with: an agent (its engine and sampling settings) and the data."""

    agent: Any
    """An rl-algos agent on the worker's own copy of the model."""
    env: Any = None
    """A ``ReasoningGym`` (prompts and rewards), built like the trainer's; None (unused) when
    the worker plays multi-turn episodes (:attr:`WorkerStart.episodes`)."""


@dataclass(frozen=True)
class WorkerStart:
    """Everything the worker needs to begin where the trainer is."""

    factory: Callable[[], RolloutPieces]
    """Builds the worker's pieces (picklable: a module-level function or a partial of one)."""
    env_state: dict[str, Any] | None
    """The environment's iteration state to continue from (None: a fresh start)."""
    rng_state: Any
    """The trainer agent's ``random.Random`` state: the seeds of the next batches."""
    start_index: int
    """The loop step of the first batch (a resumed run's step)."""
    max_staleness: int
    """See :class:`rl_train.config.AsyncConfig`."""
    strategy: str
    """``wait`` or ``drop``."""
    threads: int
    """Torch threads of the worker."""
    parent_pid: int
    """The trainer's pid (the worker exits when it is gone)."""
    timeout_s: float = 120.0
    """Seconds a call to a rollout server (:attr:`engine_url`) may take."""
    episodes: MultiTurnSource | None = None
    """Multi-turn episodes to play instead of the ``ReasoningGym``'s prompts (picklable: its
    ``env_factory`` a module-level function or a ``functools.partial`` of one)."""
    engine_url: str | None = None
    """A rollout server to generate with (:class:`rl_rollout.RemoteEngine`; the trainer's
    weights are pushed to it), instead of the worker agent's own engine."""


@dataclass(frozen=True)
class WeightUpdate:
    """Trainer -> worker: the actor's trainable tensors after ``version`` updates."""

    version: int
    """Updates applied to these weights (the trainer's loop step)."""
    payload: bytes
    """``{dtype: (names in policy.causal_lm, Packed)}``, pickled."""
    tensor_bytes: int
    """Bytes of tensor data in ``payload`` (LoRA: the adapter's only)."""


@dataclass(frozen=True)
class StopWorker:
    """Trainer -> worker: finish now."""


@dataclass(frozen=True)
class RolloutBatch:
    """Worker -> trainer: one sampled and scored batch, tagged with its policy version."""

    index: int
    """Batches sampled before this one (from the run's start, a resumed run's step included)."""
    version: int
    """The policy version (updates applied) the batch was sampled with."""
    payload: bytes
    """The :class:`~rl_algos.Rollout` and the reported rewards (:func:`encode_experience`)."""
    env_state: dict[str, Any] | None
    """The environment's iteration state after ``env.step`` (what a checkpoint saves)."""
    num_epochs: int | None
    """Completed passes over the data after this batch (the reference policy follows it);
    None for episodes."""
    rng_state: Any
    """The worker agent's RNG state after drawing this batch's seed."""
    seconds: float
    """Worker wall time since its previous batch was queued."""
    idle: float
    """Of ``seconds``, the time spent waiting (for weights or queue space)."""

    def experience(self) -> Experience:
        """The :class:`~rl_train.experience.Experience` decoded from :attr:`payload`."""
        rollout, rewards = _decode(self.payload)
        values = {k: _unwrap(v) for k, v in rollout.items()}
        return Experience(Rollout(**values), _unwrap(rewards), self.num_epochs)


@dataclass(frozen=True)
class WorkerFailed:
    """Worker -> trainer: the worker raised; the traceback."""

    error: str
    """``traceback.format_exc()`` of the worker."""


@dataclass(frozen=True)
class Packed:
    """Tensors of one dtype as one flat byte string plus their shapes: cheap to (un)pickle.

    The raw bytes (not a pickled tensor, whose storage pickles through ``torch.save``, a
    per-tensor cost) keep a batch's decode and a weight push cheap (``docs/benchmarks.md``).
    """

    shapes: tuple[tuple[int, ...], ...]
    """Each tensor's shape, in order."""
    dtype: torch.dtype
    """The tensors' dtype."""
    data: bytes
    """The tensors' values, concatenated (a copy: later in-place updates do not reach it)."""

    @staticmethod
    def of(tensors: Sequence[torch.Tensor]) -> Packed:
        """Pack ``tensors`` (all of one dtype)."""
        shapes = tuple(tuple(t.shape) for t in tensors)
        if not tensors:
            return Packed(shapes, torch.float32, b"")
        dtype = tensors[0].dtype
        flat = torch.cat([t.detach().cpu().reshape(-1) for t in tensors])
        return Packed(shapes, dtype, flat.view(torch.uint8).numpy().tobytes())

    def unpack(self) -> list[torch.Tensor]:
        """The tensors (views of one writable buffer)."""
        if self.data:
            flat = torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(self.dtype)
        else:
            flat = torch.empty(0, dtype=self.dtype)
        sizes = [math.prod(s) for s in self.shapes]
        chunks = flat.split(sizes) if sizes else ()
        return [c.view(s) for c, s in zip(chunks, self.shapes, strict=True)]


def _encode(obj: Any) -> bytes:
    """Plain pickle (not the shared-memory reductions of torch.multiprocessing queues)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _decode(payload: bytes) -> Any:
    return pickle.loads(payload)  # our own worker's or trainer's bytes


def actor_named_parameters(agent: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """The actor's trainable parameters by name in ``agent.policy.causal_lm`` (LoRA: adapters).

    The list to hand :func:`weight_update` at every push (it stays valid while the agent's
    parameters are updated in place, as the optimizer does).
    """
    trainable = {id(p) for p in agent.actor_parameters()}
    return [(n, p) for n, p in agent.policy.causal_lm.named_parameters() if id(p) in trainable]


def actor_tensors(agent: Any) -> dict[str, torch.Tensor]:
    """The actor's trainable tensors by name in ``agent.policy.causal_lm`` (LoRA: adapters only).

    Args:
        agent: An rl-algos agent.

    Returns:
        ``{name: detached CPU tensor}``: every weight when fully fine-tuned, else the actor
        adapter's LoRA weights.
    """
    return {name: p.detach().cpu() for name, p in actor_named_parameters(agent)}


def weight_update(
    agent: Any, version: int, named: Sequence[tuple[str, torch.Tensor]] | None = None
) -> WeightUpdate:
    """The :class:`WeightUpdate` of ``agent``'s actor at ``version``.

    Args:
        agent: An rl-algos agent.
        version: The policy version (updates applied).
        named: :func:`actor_named_parameters` of ``agent``, computed once (None: look them up).
    """
    if named is None:
        named = actor_named_parameters(agent)
    size = sum(t.numel() * t.element_size() for _, t in named)
    groups: dict[torch.dtype, tuple[list[str], list[torch.Tensor]]] = {}
    for name, t in named:
        names, values = groups.setdefault(t.dtype, ([], []))
        names.append(name)
        values.append(t)
    packed = {str(k): (names, Packed.of(values)) for k, (names, values) in groups.items()}
    return WeightUpdate(version, _encode(packed), size)


def apply_weights(agent: Any, update: WeightUpdate) -> None:
    """Load ``update`` into ``agent``'s generation engine (``Engine.update_weights``).

    On a rollout server (:class:`rl_algos.server_sync.ServerEngine`) the tensors go into the
    worker's model, and from there to the server: a LoRA actor's adapter only, tagged with
    ``update.version``, which every sample of the server then carries.
    """
    packed: dict[str, tuple[list[str], Packed]] = _decode(update.payload)
    if hasattr(agent.engine, "apply_update"):
        pairs = [zip(names, values.unpack(), strict=True) for names, values in packed.values()]
        agent.engine.apply_update([p for group in pairs for p in group], update.version)
        return
    for names, values in packed.values():
        agent.engine.update_weights(zip(names, values.unpack(), strict=True))


class _StopRequestedError(Exception):
    """The trainer asked the worker to stop (or is gone)."""


def _die_with_parent(parent_pid: int) -> None:
    """Be killed when the trainer dies (Linux), and leave at once if it is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:  # pragma: no cover - no glibc: the pid check below still applies
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


class _Inbox:
    """The worker's side of the trainer -> worker queue: the newest weights, or a stop."""

    def __init__(self, inbox: Any, agent: Any, parent_pid: int) -> None:
        self.inbox = inbox
        self.agent = agent
        self.parent_pid = parent_pid
        self.version = -1

    def poll(self, need: int | None) -> None:
        """Apply the newest weights waiting; block until ``version >= need`` (None: no wait).

        Raises:
            _StopRequestedError: a :class:`StopWorker` arrived or the trainer is gone.
        """
        newest: WeightUpdate | None = None
        while True:
            waiting = (
                need is not None
                and max(self.version, -1 if newest is None else newest.version) < need
            )
            try:
                message = self.inbox.get(timeout=POLL_S) if waiting else self.inbox.get_nowait()
            except queue.Empty:
                if os.getppid() != self.parent_pid:
                    raise _StopRequestedError from None
                if waiting:
                    continue
                break
            if isinstance(message, StopWorker):
                raise _StopRequestedError
            newest = message
        if newest is not None and newest.version > self.version:
            apply_weights(self.agent, newest)
            self.version = newest.version


def _put(outbox: Any, batch: RolloutBatch, inbox: _Inbox) -> None:
    """Queue ``batch``, waiting for space; newer weights are applied meanwhile."""
    while True:
        try:
            outbox.put(batch, timeout=POLL_S)
            return
        except queue.Full:
            inbox.poll(None)


def _unwrap(value: Any) -> Any:
    """A :class:`Packed` single tensor back as the tensor; anything else as it is."""
    if isinstance(value, Packed) and len(value.shapes) == 1:
        return value.unpack()[0]
    return value


def encode_experience(experience: Experience) -> bytes:
    """The :attr:`RolloutBatch.payload` of ``experience``: each tensor as a :class:`Packed`."""
    rollout = experience.rollout
    values = {f.name: getattr(rollout, f.name) for f in fields(rollout)}
    packed = {k: Packed.of([v]) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return _encode((packed, Packed.of([experience.rewards])))


def worker_main(start: WorkerStart, inbox: Any, outbox: Any) -> None:
    """The worker process: sample, score and queue batches until stopped (see the module doc).

    Args:
        start: Where to begin.
        inbox: Trainer -> worker queue (:class:`WeightUpdate`, :class:`StopWorker`).
        outbox: Worker -> trainer queue (:class:`RolloutBatch`, :class:`WorkerFailed`), bounded.
    """
    _die_with_parent(start.parent_pid)
    try:
        torch.set_num_threads(start.threads)
        pieces = start.factory()
        agent, env = pieces.agent, pieces.env
        if start.engine_url is not None:
            from rl_algos.server_sync import use_server

            use_server(agent, start.engine_url, timeout=start.timeout_s)
        agent._rng.setstate(start.rng_state)
        prompts = None
        if start.episodes is None:
            if start.env_state is not None:
                env.load_state_dict(start.env_state)
                prompts = env.current_batch
            if prompts is None:
                prompts = env.reset(reset_dataloaders=True)
        weights = _Inbox(inbox, agent, start.parent_pid)
        index = start.start_index
        weights.poll(start.start_index)  # the trainer's weights, before the first batch
        last, put_wait = time.perf_counter(), 0.0
        while True:
            t0 = time.perf_counter()
            weights.poll(index - start.max_staleness if start.strategy == "wait" else None)
            idle = time.perf_counter() - t0 + put_wait
            state = None
            if start.episodes is not None:
                experience = start.episodes.rollout(agent, 0, index)
            else:
                experience, prompts = collect(agent, env, prompts)
                state = env.state_dict() if hasattr(env, "state_dict") else None
            payload = encode_experience(experience)
            t1 = time.perf_counter()
            batch = RolloutBatch(
                index, weights.version, payload, state, experience.num_epochs,
                agent._rng.getstate(), t1 - last, idle,
            )  # fmt: skip
            _put(outbox, batch, weights)
            put_wait, last = time.perf_counter() - t1, t1
            index += 1
    except _StopRequestedError:
        outbox.cancel_join_thread()  # unread batches do not hold the exit
    except BaseException:
        try:
            _report_failure(outbox, WorkerFailed(traceback.format_exc()), start.parent_pid)
        finally:
            outbox.close()
            outbox.join_thread()
            sys.exit(1)


def _report_failure(outbox: Any, failed: WorkerFailed, parent_pid: int) -> None:
    """Queue ``failed`` behind the batches the trainer has not taken yet, however long it takes.

    The trainer reads it after them (a long training step included) or stops the worker; if
    the trainer is gone, the traceback goes to stderr instead.
    """
    while True:
        try:
            outbox.put(failed, timeout=POLL_S)
            return
        except queue.Full:
            if os.getppid() != parent_pid:
                print(failed.error, file=sys.stderr, flush=True)
                return
