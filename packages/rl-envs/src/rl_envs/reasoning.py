"""``ReasoningGym``: a question/answer dataset as a batched, single-turn RL environment."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rl_envs._splits import check_template, make_split
from rl_envs._timeout import check_timeout
from rl_envs.reward_functions import (
    RewardFunctionError,
    RewardSamples,
    resolve_reward_styles,
    score_samples,
)
from rl_envs.templates import Message, render_prompt

__all__ = ["PromptBatch", "ReasoningGym", "RewardFunctionError", "render_prompt"]

RewardFn = Callable[..., Any]


class PromptBatch(list[dict[str, Any]]):
    """The prompts of one step, with their answers: one object, so they cannot drift apart.

    A list of ``B`` Hugging Face-style dicts, one per prompt: ``input_ids`` ``[1, P]`` long,
    ``attention_mask`` ``[1, P]`` long, ``text`` (the rendered prompt), ``question``, ``answer``
    and ``index`` (the dataset row). The environment scores completions only against the batch
    it handed out last, so a reward can never be computed against another batch's answers.
    """

    split: str
    epoch: int
    step: int

    @property
    def questions(self) -> list[str]:
        """The ``B`` questions."""
        return [p["question"] for p in self]

    @property
    def answers(self) -> list[str]:
        """The ``B`` reference answers."""
        return [p["answer"] for p in self]

    @property
    def indices(self) -> list[int]:
        """The ``B`` dataset row indices."""
        return [int(p["index"]) for p in self]


class ReasoningGym:
    """A prompt dataset as a batched single-turn environment (AgileRL's API, TRL's data).

    ``reset()`` returns a :class:`PromptBatch` of ``data_batch_size_per_gpu`` prompts;
    ``step(completions)`` scores the completions of exactly that batch with the reward
    functions and returns ``(next_batch, rewards [B, G])``. Inside ``with env.eval_mode():``
    the same calls run over the test split, and the training state (the pending batch, the
    cursor, the epoch) is untouched.

    Two kinds of data:

    * **question/answer** (AgileRL; ``conversation_template`` given): each row's question is
      rendered with the template;
    * **prompt** (TRL; ``conversation_template=None``): the ``prompt_column`` holds the prompt,
      plain text (used as is) or a list of ``{"role", "content"}`` messages (rendered with the
      tokenizer's chat template, with the generation prompt). Every other column reaches the
      reward functions; an answer column is optional.

    Reward functions follow one of three conventions (:mod:`rl_envs.reward_functions`),
    detected from the signature or named by ``reward_style``: AgileRL's
    ``(completion, answer, question) -> float`` per sample; TRL's batched
    ``(prompts, completions, completion_ids, **columns) -> list[float | None]`` (``None``:
    left out of the weighted sum; ``async def`` functions run concurrently); verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info)``.

    Args:
        train_dataset: A ``datasets.Dataset`` with question and answer columns, or a prompt
            column (with ``conversation_template=None``).
        test_dataset: The evaluation split (same columns).
        tokenizer: Renders the prompts (chat template if it has one) and decodes completions.
        reward_fn: A reward function, or a list of them.
        conversation_template: Messages ``[{"role", "content"}]``; ``{question}`` (the
            question column) or any other column name in braces, except the answer column, is
            replaced by the row's value. Every placeholder must name such a column of both
            datasets (checked here); ``{{`` and ``}}`` are literal braces, and brace groups that
            are not names (JSON objects, LaTeX ``{1}``, ``{}``) stay as they are. None: the
            datasets hold ready prompts in ``prompt_column``.
        data_batch_size_per_gpu: Prompts per batch on each process.
        max_context_length: Drop prompts longer than this many tokens (with a warning).
        return_raw_completions: Also keep the decoded completions in
            :attr:`last_completions` (always done; kept for AgileRL compatibility).
        accelerator: An ``accelerate.Accelerator``: each process gets every
            ``num_processes``-th row of the same shuffled order.
        seed: Shuffling seed (identical on every process).
        shuffle: Shuffle the train split each epoch (the test split is never shuffled).
        question_column: Name of the question column.
        answer_column: Name of the answer column.
        reward_weights: One finite weight per reward function (default 1.0 each); the reward
            is their weighted sum over the functions that did not return ``None`` (0 when all
            did, with a warning).
        completions_include_prompt: Token completions passed to :meth:`step` start with the
            prompt's ids (AgileRL's ``get_action`` output), which are cut off before decoding.
        reward_style: ``None``/``"auto"`` (read each function's signature), ``"agilerl"``,
            ``"trl"``, ``"verl"`` or ``"openrlhf"``, or a list with one per function.
        prompt_column: The prompt column of prompt data (``conversation_template=None``).
        reward_timeout: Seconds a reward function may take per call (one sample of an
            AgileRL-style function, the batch of a TRL-style one; the ``async`` functions'
            coroutines together), after which :meth:`step` raises
            :class:`RewardFunctionError` naming the function and the sample. None (default):
            no limit, and the functions run on the calling thread. When set, synchronous
            functions run on a daemon worker thread, so signal-based verifiers (``math_verify``
            needs the main thread) must keep None.

    Raises:
        ValueError: An argument is invalid, e.g. a dataset lacks the question or answer
            column, a ``{placeholder}`` of ``conversation_template`` names no column of a
            dataset (the message names it, the columns, and the closest one), a weight is not
            a finite number, a row's prompt renders to no token, or a row's answer is None
            while an AgileRL-style reward function needs it (the message names the split, the
            row and the column).
    """

    def __init__(
        self,
        train_dataset: Any,
        test_dataset: Any,
        tokenizer: Any,
        reward_fn: RewardFn | Sequence[RewardFn],
        conversation_template: Sequence[Message] | None = None,
        data_batch_size_per_gpu: int = 8,
        max_context_length: int | None = None,
        return_raw_completions: bool = False,
        *,
        accelerator: Any = None,
        seed: int = 0,
        shuffle: bool = True,
        question_column: str = "question",
        answer_column: str = "answer",
        reward_weights: Sequence[float] | None = None,
        completions_include_prompt: bool = True,
        reward_style: str | Sequence[str] | None = None,
        prompt_column: str = "prompt",
        reward_timeout: float | None = None,
    ) -> None:
        if data_batch_size_per_gpu < 1:
            raise ValueError(
                f"`data_batch_size_per_gpu` must be >= 1, got {data_batch_size_per_gpu}"
            )
        fns = list(reward_fn) if isinstance(reward_fn, Sequence) else [reward_fn]
        if not fns or not all(callable(f) for f in fns):
            raise ValueError("`reward_fn` must be a callable or a non-empty list of callables")
        given = [1.0] * len(fns) if reward_weights is None else list(reward_weights)
        if len(given) != len(fns):
            raise ValueError(
                f"`reward_weights` has {len(given)} entries for {len(fns)} reward functions"
            )
        weights = []
        for k, w in enumerate(given):
            value = math.nan
            if not isinstance(w, str | bytes):
                with contextlib.suppress(TypeError, ValueError):
                    value = float(w)
            if not math.isfinite(value):
                raise ValueError(
                    f"`reward_weights` must be finite numbers, one per reward function; entry "
                    f"{k} is {w!r}"
                )
            weights.append(value)
        self.reward_timeout = check_timeout("reward_timeout", reward_timeout)
        self.reward_style = reward_style
        self._styles = resolve_reward_styles(fns, reward_style)
        if conversation_template is not None:
            check_template(conversation_template, answer_column)
        self.tokenizer = tokenizer
        self.reward_fns = fns
        self.reward_weights = weights
        self.prompt_column = prompt_column
        self.conversation_template = (
            None if conversation_template is None else [dict(m) for m in conversation_template]
        )
        self.data_batch_size_per_gpu = data_batch_size_per_gpu
        self.max_context_length = max_context_length
        self.return_raw_completions = return_raw_completions
        self.question_column = question_column
        self.answer_column = answer_column
        self.completions_include_prompt = completions_include_prompt
        self.seed = seed
        if accelerator is not None:
            self.num_processes = int(accelerator.num_processes)
            self.process_index = int(accelerator.process_index)
        else:
            self.num_processes, self.process_index = 1, 0
        self._splits = {
            "train": make_split(self, "train", train_dataset, shuffle=shuffle, drop_last=True),
            "test": make_split(self, "test", test_dataset, shuffle=False, drop_last=False),
        }
        self._mode = "train"
        self._pending: dict[str, PromptBatch | None] = {"train": None, "test": None}
        self._steps = {"train": 0, "test": 0}
        self._pending_rows: dict[str, list[int]] = {"train": [], "test": []}
        self.last_completions: list[list[str]] = []
        self.last_reward_components: dict[str, torch.Tensor] = {}

    # -- data ----------------------------------------------------------------------------------

    def _build(self, mode: str, indices: list[int]) -> PromptBatch:
        split = self._splits[mode]
        batch = PromptBatch()
        for i in indices:
            row = split.rows[i]
            ids = torch.tensor([row["ids"]], dtype=torch.long)
            batch.append(
                {
                    "input_ids": ids,
                    "attention_mask": torch.ones_like(ids),
                    "text": row["text"],
                    "question": row["question"],
                    "answer": row["answer"],
                    "index": row["index"],
                }
            )
        batch.split, batch.epoch, batch.step = mode, split.epoch, self._steps[mode]
        self._pending_rows[mode] = list(indices)
        return batch

    def _next_batch(self) -> PromptBatch:
        split = self._splits[self._mode]
        batch = self._build(self._mode, split.next_indices())
        self._steps[self._mode] += 1
        self._pending[self._mode] = batch
        return batch

    def __len__(self) -> int:
        """Train batches per epoch on this process."""
        return len(self._splits["train"].rows) // self.data_batch_size_per_gpu

    @property
    def num_epochs(self) -> int:
        """Completed passes over the train split (used to refresh the reference policy)."""
        return self._splits["train"].epoch

    dataset_passes = num_epochs

    @property
    def num_test_prompts(self) -> int:
        """Test prompts on this process."""
        return len(self._splits["test"].rows)

    # -- the environment -----------------------------------------------------------------------

    def reset(self, reset_dataloaders: bool = False) -> PromptBatch:
        """The first batch (of the test split inside :meth:`eval_mode`).

        Args:
            reset_dataloaders: Restart the current split from its first row (epoch unchanged).
        """
        split = self._splits[self._mode]
        if reset_dataloaders:
            split.restart(split.epoch)
        return self._next_batch()

    def step(
        self,
        completions: Sequence[torch.Tensor] | Sequence[Sequence[str]],
        prompts: PromptBatch | None = None,
    ) -> tuple[PromptBatch, torch.Tensor]:
        """Score the completions of the current batch; returns ``(next_batch, rewards [B, G])``.

        Args:
            completions: ``B`` entries, in the batch's order: a ``[G, L]`` token tensor each
                (with the prompt in front when ``completions_include_prompt``; padding and
                special tokens are skipped when decoding), or ``G`` strings each.
            prompts: Optionally the batch these answer; it must be the current one.

        Raises:
            RuntimeError: no batch is pending (call ``reset()`` first).
            ValueError: ``prompts`` is not the current batch, or the sizes differ.
            RewardFunctionError: a reward function raised, or did not return within
                ``reward_timeout``.
        """
        batch = self._pending[self._mode]
        if batch is None:
            raise RuntimeError(f"no {self._mode} batch is pending: call reset() first")
        if prompts is not None and prompts is not batch:
            raise ValueError(
                "`prompts` is not the batch this environment handed out last (step "
                f"{batch.step} of the {batch.split} split): completions must answer the "
                "current batch"
            )
        if len(completions) != len(batch):
            raise ValueError(
                f"`completions` has {len(completions)} entries but the current batch has "
                f"{len(batch)} prompts: pass one entry (G completions) per prompt"
            )
        entries: Sequence[Any] = completions
        decoded = [self._decode(e, prompt) for e, prompt in zip(entries, batch, strict=True)]
        texts = [t for t, _ in decoded]
        sizes = {len(t) for t in texts}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                f"every prompt needs the same number G >= 1 of completions, got {sorted(sizes)}"
            )
        rewards = self._score(texts, [i for _, i in decoded], batch)
        self.last_completions = texts
        return self._next_batch(), rewards

    def _completion_ids(self, ids: list[int]) -> list[int]:
        """Generated ids up to and including the first EOS, without trailing padding."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if eos is not None and eos in ids:
            return ids[: ids.index(eos) + 1]
        while ids and pad is not None and ids[-1] == pad:
            ids = ids[:-1]
        return ids

    def _decode(
        self, entry: torch.Tensor | Sequence[str], prompt: dict[str, Any]
    ) -> tuple[list[str], list[list[int]]]:
        if isinstance(entry, torch.Tensor):
            rows = entry if entry.dim() == 2 else entry[None]
            start = prompt["input_ids"].shape[1] if self.completions_include_prompt else 0
            if self.completions_include_prompt and (
                rows.shape[1] < start
                or not torch.equal(
                    rows[:, :start].cpu(), prompt["input_ids"].expand(rows.shape[0], -1)
                )
            ):
                raise ValueError(
                    "completion rows do not start with their prompt's ids; pass "
                    "completions_include_prompt=False if they hold the generated tokens only"
                )
            texts = [
                str(self.tokenizer.decode(r[start:].tolist(), skip_special_tokens=True))
                for r in rows
            ]
            return texts, [self._completion_ids(r[start:].tolist()) for r in rows]
        if isinstance(entry, str):
            raise ValueError("each `completions` entry must be a list of G strings, not a string")
        texts = [str(t) for t in entry]
        return texts, [
            list(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts
        ]

    def _score(
        self, texts: list[list[str]], ids: list[list[list[int]]], batch: PromptBatch
    ) -> torch.Tensor:
        """``[B, G]`` rewards of the batch's completions (:func:`score_samples`)."""
        B, G = len(texts), len(texts[0])
        split = self._splits[self._mode]
        rows = [split.rows[i] for i in self._pending_rows[self._mode]]

        def each(values: list[Any]) -> list[Any]:  # [B] -> [N], prompt-major
            return [v for v in values for _ in range(G)]

        styles = resolve_reward_styles(self.reward_fns, self.reward_style)
        queries = None
        if "openrlhf" in styles:  # prompt and completion decoded together, special tokens kept
            decode = self.tokenizer.decode
            queries = [
                str(decode([*p["input_ids"][0].tolist(), *i], skip_special_tokens=False))
                for p, group in zip(batch, ids, strict=True)
                for i in group
            ]
        samples = RewardSamples(
            group_size=G,
            prompts=each([r["prompt"] for r in rows]),
            completions=[t for group in texts for t in group],
            completion_ids=[i for group in ids for i in group],
            columns={k: each([r["columns"][k] for r in rows]) for k in rows[0]["columns"]},
            answers=each([p["answer"] for p in batch]),
            questions=each([p["question"] for p in batch]),
            prompt_texts=each([p["text"] for p in batch]),
            queries=queries,
        )
        scores = score_samples(
            self.reward_fns,
            self.reward_weights,
            styles,
            samples,
            reward_timeout=self.reward_timeout,
        )
        self.last_reward_components = {k: v.reshape(B, G) for k, v in scores.components.items()}
        return scores.total.reshape(B, G)

    def state_dict(self) -> dict[str, Any]:
        """The iteration state (cursors, epochs, shuffled orders, the pending batch), as JSON types.

        With :meth:`load_state_dict` a resumed run sees exactly the batches an uninterrupted
        run would.
        """
        return {
            "splits": {
                name: {"epoch": sp.epoch, "position": sp.position, "order": list(sp.order)}
                for name, sp in self._splits.items()
            },
            "steps": dict(self._steps),
            "pending": {
                name: None
                if b is None
                else {"rows": self._pending_rows[name], "epoch": b.epoch, "step": b.step}
                for name, b in self._pending.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the datasets must be the same)."""
        for name, sp in state["splits"].items():
            split = self._splits[name]
            if sorted(sp["order"]) != list(range(len(split.rows))):
                raise ValueError(
                    f"the saved {name} order does not fit this dataset ({len(split.rows)} rows)"
                )
            split.epoch, split.position, split.order = (
                int(sp["epoch"]),
                int(sp["position"]),
                list(sp["order"]),
            )
        self._steps = {k: int(v) for k, v in state["steps"].items()}
        for name, pending in state["pending"].items():
            self._pending[name] = None
            if pending is not None:
                batch = self._build(name, list(pending["rows"]))
                batch.epoch, batch.step = int(pending["epoch"]), int(pending["step"])
                self._pending[name] = batch

    @contextmanager
    def eval_mode(self) -> Iterator[ReasoningGym]:
        """Run ``reset``/``step`` over the test split, from its start; training state is kept."""
        if self._mode == "test":
            raise RuntimeError("already in eval_mode")
        self._mode = "test"
        self._splits["test"].restart(0)
        self._pending["test"] = None
        try:
            yield self
        finally:
            self._mode = "train"

    @property
    def current_batch(self) -> PromptBatch | None:
        """The batch handed out last in the current mode (what ``step`` will score)."""
        return self._pending[self._mode]

    @property
    def evaluating(self) -> bool:
        """Whether :meth:`eval_mode` is active."""
        return self._mode == "test"
