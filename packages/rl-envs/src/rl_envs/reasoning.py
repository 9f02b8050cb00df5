"""``ReasoningGym``: a question/answer dataset as a batched, single-turn RL environment."""

from __future__ import annotations

import math
import numbers
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_envs.templates import Message, _template_parts, _unknown_placeholders, _where, render_prompt

__all__ = ["PromptBatch", "ReasoningGym", "RewardFunctionError", "render_prompt"]

RewardFn = Callable[[str, str, str], float]


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names the sample and shows its text."""


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


@dataclass
class _Split:
    """One split's rows (already sharded) and its cursor."""

    name: str
    rows: list[dict[str, Any]]
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    epoch: int = 0
    position: int = 0
    order: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.restart(0)

    def restart(self, epoch: int) -> None:
        self.epoch = epoch
        self.position = 0
        self.order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self.order)

    def next_indices(self) -> list[int]:
        remaining = len(self.order) - self.position
        if remaining == 0 or (self.drop_last and remaining < self.batch_size):
            self.restart(self.epoch + 1)
        take = self.order[self.position : self.position + self.batch_size]
        self.position += len(take)
        return take


class ReasoningGym:
    """A question/answer dataset as a batched single-turn environment (AgileRL's API).

    ``reset()`` returns a :class:`PromptBatch` of ``data_batch_size_per_gpu`` prompts;
    ``step(completions)`` scores the completions of exactly that batch with
    ``reward_fn(completion, answer, question)`` and returns ``(next_batch, rewards [B, G])``.
    Inside ``with env.eval_mode():`` the same calls run over the test split, and the training
    state (the pending batch, the cursor, the epoch) is untouched.

    Args:
        train_dataset: A ``datasets.Dataset`` with question and answer columns.
        test_dataset: The evaluation split (same columns).
        tokenizer: Renders the prompts (chat template if it has one) and decodes completions.
        reward_fn: ``(completion, answer, question) -> float``, or a list of them.
        conversation_template: Messages ``[{"role", "content"}]``; ``{question}`` (the
            question column) or any other column name in braces, except the answer column, is
            replaced by the row's value. Every placeholder must name such a column of both
            datasets (checked here); ``{{`` and ``}}`` are literal braces, and brace groups that
            are not names (JSON objects, LaTeX ``{1}``, ``{}``) stay as they are.
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
        reward_weights: One weight per reward function (default 1.0 each); the reward is
            their weighted sum.
        completions_include_prompt: Token completions passed to :meth:`step` start with the
            prompt's ids (AgileRL's ``get_action`` output), which are cut off before decoding.

    Raises:
        ValueError: An argument is invalid, e.g. a dataset lacks the question or answer
            column, or a ``{placeholder}`` of ``conversation_template`` names no column of a
            dataset (the message names it, the columns, and the closest one).
    """

    def __init__(
        self,
        train_dataset: Any,
        test_dataset: Any,
        tokenizer: Any,
        reward_fn: RewardFn | Sequence[RewardFn],
        conversation_template: Sequence[Message],
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
    ) -> None:
        if data_batch_size_per_gpu < 1:
            raise ValueError(
                f"`data_batch_size_per_gpu` must be >= 1, got {data_batch_size_per_gpu}"
            )
        fns = list(reward_fn) if isinstance(reward_fn, Sequence) else [reward_fn]
        if not fns or not all(callable(f) for f in fns):
            raise ValueError("`reward_fn` must be a callable or a non-empty list of callables")
        weights = [1.0] * len(fns) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(fns):
            raise ValueError(
                f"`reward_weights` has {len(weights)} entries for {len(fns)} reward functions"
            )
        if not conversation_template or not all(
            isinstance(m, dict) and {"role", "content"} <= set(m) for m in conversation_template
        ):
            raise ValueError(
                "`conversation_template` must be a non-empty list of {'role', 'content'} dicts, "
                "e.g. [{'role': 'user', 'content': 'Q: {question}\\nA:'}]"
            )
        shown = [
            name
            for index, m in enumerate(conversation_template)
            for _, name in _template_parts(str(m["content"]), {answer_column}, _where(index, m))
        ]
        if answer_column in shown:
            raise ValueError(
                f"`conversation_template` contains {{{answer_column}}}: the prompt would show "
                "the answer"
            )
        self.tokenizer = tokenizer
        self.reward_fns = fns
        self.reward_weights = weights
        self.conversation_template = [dict(m) for m in conversation_template]
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
            "train": self._make_split("train", train_dataset, shuffle=shuffle, drop_last=True),
            "test": self._make_split("test", test_dataset, shuffle=False, drop_last=False),
        }
        self._mode = "train"
        self._pending: dict[str, PromptBatch | None] = {"train": None, "test": None}
        self._steps = {"train": 0, "test": 0}
        self._pending_rows: dict[str, list[int]] = {"train": [], "test": []}
        self.last_completions: list[list[str]] = []
        self.last_reward_components: dict[str, torch.Tensor] = {}

    # -- data ----------------------------------------------------------------------------------

    def _make_split(self, name: str, dataset: Any, *, shuffle: bool, drop_last: bool) -> _Split:
        columns = list(getattr(dataset, "column_names", None) or [])
        missing = [c for c in (self.question_column, self.answer_column) if c not in columns]
        if missing:
            raise ValueError(
                f"the {name} dataset lacks the column(s) {missing}; its columns are {columns}. "
                "Rename them (Dataset.rename_column) or pass question_column/answer_column"
            )
        if len(dataset) == 0:
            raise ValueError(f"the {name} dataset is empty")
        self._check_placeholders(name, columns)
        rows: list[dict[str, Any]] = []
        dropped = 0
        for index, row in enumerate(dataset):
            if index % self.num_processes != self.process_index:
                continue
            context = {k: v for k, v in row.items() if k != self.answer_column}
            context["question"] = row[self.question_column]
            text = render_prompt(self.tokenizer, self.conversation_template, context)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.max_context_length is not None and len(ids) > self.max_context_length:
                dropped += 1
                continue
            rows.append(
                {
                    "ids": ids,
                    "text": text,
                    "question": str(row[self.question_column]),
                    "answer": str(row[self.answer_column]),
                    "index": index,
                }
            )
        if dropped:
            warnings.warn(
                f"{dropped} {name} prompt(s) longer than max_context_length="
                f"{self.max_context_length} tokens were dropped",
                stacklevel=3,
            )
        if not rows:
            raise ValueError(
                f"no {name} prompt is left on process {self.process_index} (dataset of "
                f"{len(dataset)} rows, {self.num_processes} processes, {dropped} too long)"
            )
        if drop_last and len(rows) < self.data_batch_size_per_gpu:
            raise ValueError(
                f"data_batch_size_per_gpu={self.data_batch_size_per_gpu} exceeds the {len(rows)} "
                f"{name} rows of this process: lower it or add data"
            )
        return _Split(name, rows, self.data_batch_size_per_gpu, shuffle, drop_last, self.seed)

    def _check_placeholders(self, name: str, columns: list[str]) -> None:
        """Every ``{placeholder}`` of the template must be filled from this split's rows."""
        # what _make_split renders with: the columns but the answer, and the question as
        # ``question`` whatever its column is called
        available = sorted((set(columns) - {self.answer_column}) | {"question"})
        unknown = [
            (where, placeholder)
            for index, message in enumerate(self.conversation_template)
            for where in [_where(index, message)]
            for _, placeholder in _template_parts(str(message["content"]), available, where)
            if placeholder is not None and placeholder not in available
        ]
        if unknown:
            source = f"a column of the {name} dataset"
            raise ValueError(_unknown_placeholders(unknown, available, source))

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
            RewardFunctionError: a reward function raised.
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
        texts = [self._decode(e, prompt) for e, prompt in zip(entries, batch, strict=True)]
        sizes = {len(t) for t in texts}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                f"every prompt needs the same number G >= 1 of completions, got {sorted(sizes)}"
            )
        rewards = self._score(texts, batch)
        self.last_completions = texts
        return self._next_batch(), rewards

    def _decode(self, entry: torch.Tensor | Sequence[str], prompt: dict[str, Any]) -> list[str]:
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
            return [
                str(self.tokenizer.decode(r[start:].tolist(), skip_special_tokens=True))
                for r in rows
            ]
        if isinstance(entry, str):
            raise ValueError("each `completions` entry must be a list of G strings, not a string")
        return [str(t) for t in entry]

    def _score(self, texts: list[list[str]], batch: PromptBatch) -> torch.Tensor:
        B, G = len(texts), len(texts[0])
        total = torch.zeros(B, G, dtype=torch.float32)
        components: dict[str, torch.Tensor] = {}
        for fn, weight in zip(self.reward_fns, self.reward_weights, strict=True):
            name = getattr(fn, "__name__", type(fn).__name__)
            values = torch.zeros(B, G, dtype=torch.float32)
            for b, (group, prompt) in enumerate(zip(texts, batch, strict=True)):
                for g, text in enumerate(group):
                    sample = b * G + g
                    where = f"sample {sample} (prompt {b}, completion {g})"
                    try:
                        value = fn(text, prompt["answer"], prompt["question"])
                    except Exception as exc:
                        raise RewardFunctionError(
                            f"reward_fn {name} raised {exc!r} on {where}; completion: {text!r}"
                        ) from exc
                    if isinstance(value, torch.Tensor) and value.numel() == 1:
                        value = value.item()
                    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
                        raise ValueError(
                            f"reward_fn {name} returned {value!r} for {where}; it must return "
                            f"a finite number. Completion: {text!r}"
                        )
                    values[b, g] = float(value)
            components[name] = values
            total += weight * values
        self.last_reward_components = components
        return total

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
