"""Log-prob scoring in one place: old, reference and current, via rl-kernels' fused head.

:class:`Scorer` turns a policy's hidden states into per-token log-probs of the taken tokens at
the action positions only (:func:`rl_kernels.fused_logprobs`), so the ``[N, T, V]`` logits never
exist. Under ZeRO-3 every process runs the output projection (a collective) even when its rows
are empty or not finite.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from rl_kernels import fused_logprobs, sum_pi_squared

from rl_algos.batch import Batch, Scores
from rl_algos.distributed import gathered
from rl_algos.microbatch import RowSplit, split_rows
from rl_algos.packing import PackingReport, packed_hidden_states
from rl_algos.router_balance import RouterBalance
from rl_algos.router_replay import RouterReplay, laid_out
from rl_algos.shared_prefix import MIN_SAVED_WORK, SHARED_PREFIX_IMPLEMENTATIONS, shares_previous
from rl_algos.varlen_attention import attention_implementation

__all__ = ["Scorer", "score_batch"]


@dataclass(frozen=True)
class Scorer:
    """How the agent scores tokens: its policy, temperature, chunking and ZeRO stage."""

    policy: Any
    """An :class:`rl_adapters.PolicyModel` (``hidden_states``, ``lm_head_weight``, roles)."""
    temperature: float = 1.0
    """The training logits are divided by it (as the sampler's were)."""
    chunk_rows: int | None = None
    """Rows per chunk of the fused head (None: rl-kernels' memory-budget choice)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (3: the head is partitioned and gathered per call)."""
    packing: bool | None = False
    """Run the rows of each forward as one packed sequence (:mod:`rl_algos.packing`): True
    always (raises where it cannot), None where it can (:attr:`report` decides), False never."""
    split: RowSplit = field(default_factory=RowSplit)
    """How the no-grad passes (:func:`score_batch`, critic values) cut the batch."""
    report: PackingReport = field(default_factory=PackingReport)
    """With ``packing=None``: chooses per forward and records the fallbacks (the agent's)."""
    share_prefix: bool | None = None
    """In a packed forward, rows that start with the same prompt compute it once
    (:mod:`rl_algos.shared_prefix`): None with SDPA or eager attention wherever it saves a
    token, but in a forward whose rows all have one length only where the work it saves
    reaches :data:`~rl_algos.shared_prefix.MIN_SAVED_WORK`; True wherever it saves a token
    (raises under another attention implementation); False never."""
    router: RouterBalance | None = None
    """A mixture-of-experts policy's load-balancing loss (None: off): inside its
    :meth:`~rl_algos.router_balance.RouterBalance.training`, the actor's forwards record their
    router logits, laid out per row like the hidden states."""
    replay: RouterReplay | None = None
    """A mixture-of-experts policy's routing replay (None: off): inside its
    :meth:`~rl_algos.router_replay.RouterReplay.recording` or
    :meth:`~rl_algos.router_replay.RouterReplay.replaying`, the actor's forwards record or
    force their routes (and rows do not share a prompt: each row routes its own tokens)."""

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        role: str = "actor",
        scored: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[N, T, H] hidden states of positions 0..L-2 (each predicts the next token).

        Shifted by one: position ``t`` predicts token ``t + 1``. Packed (:attr:`packing`):
        computed as one ``[1, S]`` sequence and scattered back (zeros on the padding). With
        ``scored`` ([N, T] bool, shifted by one: the positions the caller reads), consecutive
        rows with the same tokens before their first scored one share them
        (:attr:`share_prefix`).
        """
        router = self.router if self.router is not None and self.router.reads else None
        if router is None or role != "actor":
            return self._hidden_states(input_ids, attention_mask, role, scored, None)
        with router.recording():
            hidden = self._hidden_states(input_ids, attention_mask, role, scored, router)
        return router.detach(hidden)[:, :-1]

    def _hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        role: str,
        scored: torch.Tensor | None,
        router: RouterBalance | None,
    ) -> torch.Tensor:
        """:meth:`hidden_states`; with ``router`` all ``L`` positions, router logits appended."""
        replay = self.replay if self.replay is not None and self.replay.active else None
        if replay is not None and role != "actor":
            replay = None
        elif replay is not None:
            scored = None  # each row's own routes: no shared prompt (rl_algos.router_replay)
        packing = self.packing
        if packing is None:
            packing = self.report.choose(self.policy.causal_lm, attention_mask)
        if packing:  # checked by choose() already under auto
            checked = self.packing is None
            if self.share_prefix is False:
                scored = None
            elif self.share_prefix and scored is not None:
                impl = attention_implementation(self.policy.causal_lm)
                if impl not in SHARED_PREFIX_IMPLEMENTATIONS:
                    raise ValueError(
                        f"share_prompt_prefix=True needs SDPA or eager attention, the model runs "
                        f"{impl!r}: pass share_prompt_prefix=None (shares where it can) or False"
                    )
            # the default: rows of one length share where it saves more than the layout costs
            work = 0 if self.share_prefix else MIN_SAVED_WORK
            packed = packed_hidden_states(
                self.policy, input_ids, attention_mask, role, checked, scored, self.report, work,
                router, replay,
            )  # fmt: skip
            return packed if router is not None else packed[:, :-1]
        layout: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if replay is not None:  # flat position s is row position s of the [N, L] rows
            layout = laid_out(replay, torch.arange(input_ids.numel(), device=input_ids.device))
        with layout:
            hidden: torch.Tensor = self.policy.hidden_states(input_ids, attention_mask, role=role)
        return router.attach(hidden) if router is not None else hidden[:, :-1]

    def row_groups(
        self,
        attention_mask: torch.Tensor,
        input_ids: torch.Tensor | None = None,
        scored: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The rows of a batch (``attention_mask`` [N, L]) in no-grad forwards (:attr:`split`).

        With ``input_ids`` [N, L] and ``scored`` [N, T], a token budget keeps rows that share a
        prompt together (:meth:`together`).
        """
        rows = torch.arange(attention_mask.shape[0], device=attention_mask.device)
        together = None
        if input_ids is not None and scored is not None:
            together = self.together(input_ids, attention_mask, scored)
        return split_rows(rows, attention_mask, self.split, together)

    def together(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor
    ) -> torch.Tensor | None:
        """[M] bool for :func:`~rl_algos.microbatch.split_rows`: row ``m`` shares the prompt of
        row ``m - 1`` (:func:`~rl_algos.shared_prefix.shares_previous`), so a token budget
        keeps them in one forward; None without a token budget (consecutive rows stay
        together) or where prompts are never shared (``share_prefix`` or packing False).
        """  # noqa: D205
        if (
            self.split.micro_batch_tokens is None
            or self.share_prefix is False
            or self.packing is False
        ):
            return None
        return shares_previous(input_ids, attention_mask, scored)

    def head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([V, H], [V] or None)``: the output projection for the fused kernels.

        Under ZeRO-3 the (frozen) weights are partitioned: a gathered copy is returned, which
        the kernels keep for their backward.
        """
        weight, bias = self.policy.lm_head_weight, self.policy.lm_head_bias
        if self.zero_stage != 3:
            return weight, bias
        with gathered([weight, bias], enabled=True):
            return weight.detach().clone(), None if bias is None else bias.detach().clone()

    def trainable_partitioned_head(self) -> bool:
        """ZeRO-3 with a trainable ``lm_head`` (full fine-tuning): the module path is needed."""
        head = [self.policy.lm_head_weight, self.policy.lm_head_bias]
        return self.zero_stage == 3 and any(p is not None and p.requires_grad for p in head)

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        role: str = "actor",
    ) -> torch.Tensor:
        """[N, T] log-probs of tokens 1..L-1 at ``mask`` positions (0 elsewhere).

        Args:
            input_ids: [N, L].
            attention_mask: [N, L].
            mask: [N, T] bool, shifted by one.
            role: ``"actor"``, ``"reference"`` (or ``"critic"``) adapter of the policy.

        Non-finite hidden states give NaN at the mask (the optimizer step's guard then raises or
        skips); the graph stays connected either way.
        """
        return self.from_hidden(
            self.hidden_states(input_ids, attention_mask, role, mask), input_ids, mask
        )

    def from_hidden(
        self, hidden: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """[N, T] log-probs from [N, T, H] ``hidden`` (see :meth:`logprobs`)."""
        return self._score(hidden, input_ids, mask, False)[0]

    def logprobs_and_sum_pi_squared(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        role: str = "actor",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(logprobs [N, T], sum_pi_squared [N, T])`` from one forward (no gradient to the
        second): :meth:`logprobs` and :math:`\sum_v \pi_t(v)^2` of the same distribution at
        the ``mask`` positions (0 elsewhere; NaN where :meth:`logprobs` gives NaN).

        The fused head computes both from the same tiles
        (``rl_kernels.fused_logprobs(..., with_sum_pi_squared=True)``); the module path of a
        trainable ZeRO-3 head takes :func:`rl_kernels.sum_pi_squared` of each chunk's logits.
        """  # noqa: D205
        hidden = self.hidden_states(input_ids, attention_mask, role, mask)
        logp, spi = self._score(hidden, input_ids, mask, True)
        assert spi is not None
        return logp, spi

    def _score(
        self, hidden: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor, with_spi: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[N, T] log-probs (and, ``with_spi``, [N, T] sums of squared probabilities)."""
        targets = input_ids[:, 1:]
        out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
        spi_out = torch.zeros_like(out) if with_spi else None
        if not bool(mask.any()) and self.zero_stage != 3:
            return out + 0.0 * hidden.sum(), spi_out  # keeps the graph connected
        rows = hidden[mask]
        finite = bool(torch.isfinite(rows).all())
        if not finite:
            rows = rows.nan_to_num(0.0, 0.0, 0.0)
        spi = rows.new_zeros(0)
        if self.trainable_partitioned_head():
            picked, spi = self._by_module(rows, targets[mask], with_spi)
        else:
            weight, bias = self.head()  # a collective under ZeRO-3: also for empty rows
            picked = rows.new_zeros(0)
            if rows.shape[0]:
                fused = fused_logprobs(
                    rows,
                    weight,
                    targets[mask],
                    bias=bias,
                    temperature=self.temperature,
                    chunk_rows=self.chunk_rows,
                    check_finite=False,  # checked above (non-finite rows became zeros)
                    with_sum_pi_squared=with_spi,
                )
                picked, spi = fused if isinstance(fused, tuple) else (fused, spi)
        if spi_out is not None:
            spi_out = spi_out.masked_scatter(mask, spi.detach().float())
            if not finite:
                spi_out = spi_out.masked_fill(mask, math.nan)
        if not finite:
            return out.masked_fill(mask, math.nan) + 0.0 * picked.sum(), spi_out
        out = out.masked_scatter(mask, picked.float())
        return (out + 0.0 * hidden.sum() if rows.shape[0] == 0 else out), spi_out

    def _by_module(
        self, rows: torch.Tensor, targets: torch.Tensor, with_spi: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[M] log-probs (and [M] sums of squared probabilities, ``with_spi``; else empty)
        through the output-embedding module, chunked (ZeRO-3, trainable head).

        ZeRO-3 gathers a partitioned, trainable ``lm_head`` only inside the module's own forward
        hooks, which also route its gradient back to the partitions; the fused kernel, which
        reads the weight directly, cannot. Each chunk materialises ``[chunk, V]`` logits.
        """  # noqa: D205
        head = self.policy.causal_lm.get_output_embeddings()
        chunk = self.chunk_rows or 1024
        parts, spis = [], []
        for s in range(0, max(1, rows.shape[0]), chunk):  # also empty: the gather is collective
            logits = head(rows[s : s + chunk]).float() / self.temperature
            parts.append(logits.log_softmax(-1).gather(-1, targets[s : s + chunk, None])[:, 0])
            if with_spi:
                spis.append(sum_pi_squared(logits))
        return torch.cat(parts), torch.cat(spis) if spis else rows.new_zeros(0)


def score_batch(
    scorer: Scorer,
    batch: Batch,
    with_reference: bool,
    with_old: bool = True,
    old_from_sampler: bool = False,
    with_sum_pi_squared: bool = False,
) -> Scores:
    """The batch's :class:`Scores` (no grad: the forwards run in inference mode).

    The actor's log-probs unless ``with_old`` is False (an on-policy update, see
    :attr:`Scores.old_logprobs`), and the reference's when ``with_reference``. The rows run in
    the forwards of :meth:`Scorer.row_groups` (all at once without a token budget). With
    ``old_from_sampler`` and sampling log-probs in the batch, those are the old log-probs
    (the behaviour policy's; no forward). With ``with_sum_pi_squared`` the actor's forward
    also gives :attr:`Scores.sum_pi_squared` for every row (it then runs even when the old
    log-probs come from the sampler: the sampler's full distribution is not returned, so the
    actor's, equal to it up to the engines' numerics, stands in). With the scorer's routing
    replay, the forward that scores the old log-probs records :attr:`Scores.routes`.
    """
    groups = scorer.row_groups(batch.attention_mask, batch.input_ids, batch.mask)

    def zeros() -> torch.Tensor:
        # made outside the inference mode below, so the results are ordinary tensors (an
        # inference tensor cannot be saved for a later backward); filled in place inside it
        with torch.inference_mode(False):
            return torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)

    sampler = batch.sampling_logprobs if old_from_sampler else None
    routes = _routes_to_replay(scorer, batch, with_old and sampler is None)
    r3 = scorer.replay is not None and scorer.replay.mode == "R3"

    @contextlib.contextmanager
    def recording(rows: torch.Tensor, role: str) -> Iterator[None]:
        """The actor's forward of ``rows`` inside records its routes into ``routes[rows]``
        (R2), or replays them (R3: the sampler's).
        """  # noqa: D205
        if routes is None or scorer.replay is None or role != "actor":
            yield
            return
        if r3:
            with scorer.replay.replaying(routes[rows]):
                yield
            return
        with torch.inference_mode(False):
            part = scorer.replay.empty_routes((len(rows), routes.shape[1]), routes.device)
        with scorer.replay.recording(part):
            yield
        routes[rows] = part

    def score(role: str) -> torch.Tensor:
        out = zeros()
        for rows in groups:
            ids, attn, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.mask[rows]
            with recording(rows, role):
                out[rows] = scorer.logprobs(ids, attn, mask, role)
        return out

    def score_with_spi() -> tuple[torch.Tensor, torch.Tensor]:
        out, spi = zeros(), zeros()
        for rows in groups:
            ids, attn, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.mask[rows]
            with recording(rows, "actor"):
                out[rows], spi[rows] = scorer.logprobs_and_sum_pi_squared(ids, attn, mask)
        return out, spi

    # inference mode: no grad, and no view or version tracking either (fewer costs per op);
    # the LoRA layers run the lean forward, as in the update (rl_adapters.PolicyModel.lean_lora)
    with torch.inference_mode(), scorer.policy.lean_lora():
        actor, spi = score_with_spi() if with_sum_pi_squared else (None, None)
        if sampler is not None:
            old = sampler
        elif with_old:
            old = actor if actor is not None else score("actor")
        else:
            old = None
        ref = None
        if with_reference and "reference" in scorer.policy.roles:
            ref = score("reference")
    if routes is not None:
        routes.masked_fill_(~batch.attention_mask.bool()[:, :, None, None], -1)
    return Scores(old, ref, spi, routes)


def _routes_to_replay(scorer: Scorer, batch: Batch, old_forward: bool) -> torch.Tensor | None:
    """[N, L, Y, k]: the sampler's routes (R3), or the empty routes the forward that scores
    the old log-probs (``old_forward``) fills (R2); None without routing replay or with
    nothing to replay.

    Raises:
        ValueError: R3 and a batch without the sampler's routes.
    """  # noqa: D205
    replay = scorer.replay
    if replay is None:
        return None
    if replay.mode == "R3":
        if batch.sampling_routes is None:
            raise ValueError(
                "router_replay='R3' replays the sampler's routes, and this batch has none: "
                "learn from the Rollout that get_action returns (its sampling_routes; "
                "multi-turn episodes and (ids, masks, rewards) tuples carry none), or pass "
                "router_replay='R2'"
            )
        with torch.inference_mode(False):
            real = batch.attention_mask.bool()[:, :, None, None]
            return batch.sampling_routes.masked_fill(~real, -1)
    if not old_forward:
        warnings.warn(
            "router_replay='R2' has nothing to replay in an on-policy learn() (one optimizer "
            "step: update_epochs=1 and batch_size >= the batch's rows), whose forward is the "
            "old policy's; the routes are recorded and replayed from a second step on",
            stacklevel=4,
        )
        return None
    with torch.inference_mode(False):
        return replay.empty_routes(batch.input_ids.shape, batch.mask.device)
