"""A :class:`~rl_envs.ReasoningGym` split built from its dataset: rows, prompts and answers.

:func:`make_split` checks a dataset's columns against the gym's settings (the question and
answer columns, or the prompt column; the template's placeholders; an answer column for
AgileRL-style reward functions), renders each of this process's rows to its prompt text and
token ids, keeps its answer and reward columns, and refuses a row whose answer is None when a
reward function needs it or whose prompt renders to no token; :class:`Split` holds the rows
and the cursor over them (the shuffled order, the position, the epoch).
:func:`check_template` checks a question/answer conversation template.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl_envs.templates import (
    Message,
    _template_parts,
    _unknown_placeholders,
    _where,
    render_dataset_prompt,
    render_prompt,
)

if TYPE_CHECKING:
    from rl_envs.reasoning import ReasoningGym

__all__ = ["Split", "check_template", "make_split"]


@dataclass
class Split:
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


def make_split(
    gym: ReasoningGym, name: str, dataset: Any, *, shuffle: bool, drop_last: bool
) -> Split:
    """The ``name`` split of ``dataset`` as ``gym`` keeps it: this process's rows, checked."""
    columns = list(getattr(dataset, "column_names", None) or [])
    _check_columns(gym, name, columns)
    if len(dataset) == 0:
        raise ValueError(f"the {name} dataset is empty")
    rows: list[dict[str, Any]] = []
    dropped = 0
    for index, row in enumerate(dataset):
        if index % gym.num_processes != gym.process_index:
            continue
        kept = _row(gym, name, index, row)
        ids = list(gym.tokenizer(kept["text"], add_special_tokens=False)["input_ids"])
        if not ids:
            column = gym.prompt_column if gym.conversation_template is None else gym.question_column
            raise ValueError(
                f"row {index} of the {name} dataset renders to an empty prompt (0 tokens; "
                f"{kept['text']!r}): fill its {column!r} column or drop the row "
                "(Dataset.filter)"
            )
        if gym.max_context_length is not None and len(ids) > gym.max_context_length:
            dropped += 1
            continue
        rows.append({"ids": ids, "index": index, **kept})
    if dropped:
        warnings.warn(
            f"{dropped} {name} prompt(s) longer than max_context_length="
            f"{gym.max_context_length} tokens were dropped",
            stacklevel=3,
        )
    if not rows:
        raise ValueError(
            f"no {name} prompt is left on process {gym.process_index} (dataset of "
            f"{len(dataset)} rows, {gym.num_processes} processes, {dropped} too long)"
        )
    if drop_last and len(rows) < gym.data_batch_size_per_gpu:
        raise ValueError(
            f"data_batch_size_per_gpu={gym.data_batch_size_per_gpu} exceeds the {len(rows)} "
            f"{name} rows of this process: lower it or add data"
        )
    return Split(name, rows, gym.data_batch_size_per_gpu, shuffle, drop_last, gym.seed)


def _check_columns(gym: ReasoningGym, name: str, columns: list[str]) -> None:
    """The dataset has the columns the gym's template or prompt column and rewards need."""
    if gym.conversation_template is not None:
        missing = [c for c in (gym.question_column, gym.answer_column) if c not in columns]
        if missing:
            raise ValueError(
                f"the {name} dataset lacks the column(s) {missing}; its columns are "
                f"{columns}. Rename them (Dataset.rename_column) or pass "
                "question_column/answer_column; for TRL-style data with a prompt column, "
                "pass conversation_template=None"
            )
        _check_placeholders(gym, name, columns)
        return
    if gym.prompt_column not in columns:
        raise ValueError(
            f"the {name} dataset has no {gym.prompt_column!r} column; its columns are "
            f"{columns}. Pass prompt_column= naming the prompt column, or "
            "conversation_template=[...] for question/answer data"
        )
    if gym.answer_column not in columns:
        for fn, style in zip(gym.reward_fns, gym._styles, strict=True):
            if style == "agilerl":
                raise ValueError(
                    f"reward function {getattr(fn, '__name__', fn)!r} takes AgileRL's "
                    f"(completion, answer, question) but the {name} dataset has no "
                    f"{gym.answer_column!r} column (columns: {columns}): write it "
                    "TRL-style, reward(completions, **columns) -> list[float | None], or "
                    "pass answer_column="
                )


def _check_placeholders(gym: ReasoningGym, name: str, columns: list[str]) -> None:
    """Every ``{placeholder}`` of the template must be filled from this split's rows."""
    assert gym.conversation_template is not None
    # what make_split renders with: the columns but the answer, and the question as
    # ``question`` whatever its column is called
    available = sorted((set(columns) - {gym.answer_column}) | {"question"})
    unknown = [
        (where, placeholder)
        for index, message in enumerate(gym.conversation_template)
        for where in [_where(index, message)]
        for _, placeholder in _template_parts(str(message["content"]), available, where)
        if placeholder is not None and placeholder not in available
    ]
    if unknown:
        source = f"a column of the {name} dataset"
        raise ValueError(_unknown_placeholders(unknown, available, source))


def _row(gym: ReasoningGym, name: str, index: int, row: dict[str, Any]) -> dict[str, Any]:
    """One dataset row as the environment keeps it (prompt text and reward inputs)."""
    if gym.conversation_template is None:
        prompt = row[gym.prompt_column]
        text = render_dataset_prompt(gym.tokenizer, prompt, f"row {index} of the {name} dataset")
        if gym.question_column in row:
            question = str(row[gym.question_column])
        else:
            question = prompt if isinstance(prompt, str) else str(prompt[-1]["content"])
        answer = _answer(gym, name, index, row)
        columns = {k: v for k, v in row.items() if k != gym.prompt_column}
        return {"prompt": prompt, "text": text, "question": question, "answer": answer,
                "columns": columns}  # fmt: skip
    context = {k: v for k, v in row.items() if k != gym.answer_column}
    context["question"] = row[gym.question_column]
    text = render_prompt(gym.tokenizer, gym.conversation_template, context)
    return {"prompt": text, "text": text, "question": str(row[gym.question_column]),
            "answer": _answer(gym, name, index, row), "columns": dict(row)}  # fmt: skip


def _answer(gym: ReasoningGym, name: str, index: int, row: dict[str, Any]) -> str:
    """The row's answer as text (``""`` without an answer column)."""
    if gym.answer_column not in row:
        return ""
    answer = row[gym.answer_column]
    if answer is None:
        needs = [
            getattr(fn, "__name__", type(fn).__name__)
            for fn, style in zip(gym.reward_fns, gym._styles, strict=True)
            if style == "agilerl"
        ]
        if needs:
            raise ValueError(
                f"row {index} of the {name} dataset has no answer (None in column "
                f"{gym.answer_column!r}), which reward function {needs[0]} would score "
                "against the text 'None': fill the answer or drop the row (Dataset.filter)"
            )
    return str(answer)


def check_template(conversation_template: Sequence[Message], answer_column: str) -> None:
    """A question/answer template: non-empty messages that do not show the answer."""
    if not conversation_template or not all(
        isinstance(m, dict) and {"role", "content"} <= set(m) for m in conversation_template
    ):
        raise ValueError(
            "`conversation_template` must be a non-empty list of {'role', 'content'} dicts, "
            "e.g. [{'role': 'user', 'content': 'Q: {question}\\nA:'}]; None for a dataset "
            "with a prompt column"
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
