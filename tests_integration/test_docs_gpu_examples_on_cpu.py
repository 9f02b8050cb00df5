"""The docs' GPU training examples train on CPU with the model swapped for a tiny one (issue 37).

The blocks marked ``<!-- docs: gpu-only: ... -->`` are left out of ``test_docs_pages.py``; a
new user copies exactly these, and they are the ones that turn on ``gradient_checkpointing``.
Each test here runs one such block's own source, after a small per-page table of textual
substitutions (each pattern must be found in the block, so a docs edit that breaks the table
fails here instead of silently running something else):

- the hub model name -> a directory where a tiny random-weight Qwen2 was saved with
  ``save_pretrained`` (``rl_testing.models.save_tiny``), and ``AutoTokenizer.from_pretrained(name)``
  -> its ``tokenizer/`` subdirectory (a char tokenizer with a chat template; kept apart from the
  model's qwen2 ``config.json`` so transformers does not swap its pre-tokenizer);
- ``device="cuda"`` -> ``"cpu"``, ``torch.bfloat16`` -> ``torch.float32``;
- ILQL's sentiment classifier (``lvwerra/distilbert-imdb``) -> a tiny random-weight
  ``Qwen2ForSequenceClassification`` with the labels ``NEGATIVE``/``POSITIVE``, saved with
  ``save_pretrained`` next to the same char tokenizer (its scores are noise; the block's
  ``eval_fn`` runs the pipeline as written);
- step counts, batch sizes, group sizes, ``max_output_tokens`` and ``max_model_len`` reduced so
  each block trains one or two steps in a few seconds.

Everything else (``gradient_checkpointing=True``, ``use_liger_loss``, LoRA, the loops'
checkpointing and evaluation) runs as written: the point is that the documented configuration
trains. Datasets the blocks download go through ``datasets.load_dataset``, which is replaced by
small local ``datasets.Dataset`` objects with the same columns for the names the pages use, and
raises for any other name (nothing is downloaded: the hub is offline).

Blocks run: ``algorithms/grpo.md``, ``algorithms/ppo.md``, ``algorithms/reinforce.md``,
``algorithms/ilql.md``, ``tutorials/reasoning.md``, ``tutorials/multiturn.md``, ``tutorials/tools.md``,
``tutorials/hpo.md``.

Blocks left out, and why:

- ``tutorials/vllm.md`` (both blocks): need vLLM and a CUDA GPU, which no CPU can stand in for.
- ``tutorials/distributed.md``: needs a launcher with several processes and DeepSpeed
  (``tests_integration/test_deepspeed.py`` covers the launch on CPU).
- ``tutorials/checkpoints.md``: loads a checkpoint that the GRPO page's 500-step run writes; it
  trains nothing.

Each block trains two steps: ``metrics.jsonl`` must show steps 1 and 2, each with a finite loss
and gradient norm and no skipped update. With a random-weight model most rewards are 0, so the
group-normalised updates (GRPO, REINFORCE here) are often exactly zero; the forward and
the backward through the checkpointed layers still run (DAPO's filter would drop every group, and
a step with no group left takes no update: its page's format bonus is swapped for one that differs
between completions), and PPO's value loss and the multi-turn
game's rewards give non-zero gradients. Where the page turns on ``gradient_checkpointing``, the
model must be checkpointing and the backward must have recomputed layers (counted at
``rl_adapters.replay``'s replay context); elsewhere nothing may be recomputed.

CPU cost: about 15 s of test time on one thread for the eight blocks (2-core EPYC, 2026-11-27).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from rl_testing.docs import python_blocks
from rl_testing.models import TINY_DEFAULTS, TOKENIZER_SUBDIR, save_tiny, tiny_causal_lm
from rl_testing.tokenizer import char_tokenizer, save_tokenizer
from transformers import Qwen2Config, Qwen2ForSequenceClassification

DOCS = Path(__file__).resolve().parents[1] / "docs"
HUB_MODEL = '"Qwen/Qwen2.5-0.5B-Instruct"'
MODEL_DIR = "{model_dir}"  # filled in with the tiny model's directory (a str literal)
CLASSIFIER_DIR = "{classifier_dir}"  # ... and the tiny sentiment classifier's

Table = list[tuple[str, str]]

TOKENIZER = (
    "AutoTokenizer.from_pretrained(name)",
    f'AutoTokenizer.from_pretrained(name + "/{TOKENIZER_SUBDIR}")',
)
ON_CPU: Table = [
    (HUB_MODEL, MODEL_DIR),
    TOKENIZER,
    ('device="cuda"', 'device="cpu"'),
    ("dtype=torch.bfloat16", "dtype=torch.float32"),
]

#: page -> (the substitutions, whose every pattern must occur in its gpu-only block).
PAGES: dict[str, Table] = {
    "algorithms/grpo.md": [
        *ON_CPU,
        ("data_batch_size_per_gpu=8", "data_batch_size_per_gpu=2"),
        ("group_size=8", "group_size=2"),
        ("batch_size=64", "batch_size=4"),
        ("micro_batch_size_per_gpu=8", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=384", "max_output_tokens=4"),
        ("max_model_len=1024", "max_model_len=128"),
        ("max_steps=500", "max_steps=2"),
        ("evaluation_interval=50", "evaluation_interval=2"),
        ("checkpoint_steps=100", "checkpoint_steps=2"),
    ],
    "algorithms/ppo.md": [
        *ON_CPU,
        ('"small_arithmetic", 2000, 200', '"small_arithmetic", 8, 2'),
        ("data_batch_size_per_gpu=32", "data_batch_size_per_gpu=4"),
        ("batch_size=16", "batch_size=4"),
        ("micro_batch_size_per_gpu=8", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=64", "max_output_tokens=4"),
        ("max_model_len=512", "max_model_len=128"),
        ("max_steps=300", "max_steps=2"),
        ("evaluation_interval=25", "evaluation_interval=2"),
    ],
    "algorithms/ilql.md": [
        *ON_CPU,
        (".select(range(20000))", ".select(range(8))"),
        ("max_length=128", "max_length=48"),
        ("batch_size=64", "batch_size=4"),
        ("micro_batch_size_per_gpu=16", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=48", "max_output_tokens=4"),
        ("max_model_len=192", "max_model_len=64"),
        (
            'model="lvwerra/distilbert-imdb", device=0',
            f'model={CLASSIFIER_DIR}, tokenizer={CLASSIFIER_DIR} + "/{TOKENIZER_SUBDIR}", '
            'device="cpu"',
        ),
        ("steps=2000", "steps=2"),
        ("evaluation_interval=200", "evaluation_interval=2"),
        ("checkpoint_steps=500", "checkpoint_steps=2"),
    ],
    "algorithms/reinforce.md": [
        *ON_CPU,
        ('"small_arithmetic", 2000, 200', '"small_arithmetic", 8, 2'),
        ("data_batch_size_per_gpu=64", "data_batch_size_per_gpu=4"),
        ("batch_size=32", "batch_size=4"),
        ("micro_batch_size_per_gpu=8", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=64", "max_output_tokens=4"),
        ("max_model_len=512", "max_model_len=128"),
        ("max_steps=300", "max_steps=2"),
        ("evaluation_interval=25", "evaluation_interval=2"),
    ],
    "tutorials/reasoning.md": [
        ('"Qwen/Qwen2.5-1.5B-Instruct"', MODEL_DIR),
        *ON_CPU[1:],
        ("data_batch_size_per_gpu=16", "data_batch_size_per_gpu=2"),
        ("group_size=8", "group_size=2"),
        ("batch_size=128", "batch_size=4"),
        ("micro_batch_size_per_gpu=8", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=1024", "max_output_tokens=4"),
        ("max_model_len=1536", "max_model_len=160"),
        ("max_steps=1000", "max_steps=2"),
        ("evaluation_interval=50", "evaluation_interval=2"),
        ("checkpoint_steps=100", "checkpoint_steps=2"),
        # a random-weight model never writes the tags, and DAPO drops groups of equal rewards
        # (a step with none left takes no update): distinct completions get distinct bonuses
        (
            'return tagged_format_reward(completion, ("answer",), 0.2)',
            'return __import__("zlib").crc32(completion.encode()) % 1000 / 5000',
        ),
    ],
    "tutorials/multiturn.md": [
        *ON_CPU,
        ("max_guesses=8", "max_guesses=2"),
        ("max_turns=8", "max_turns=2"),
        ("max_model_len=1024", "max_model_len=128"),
        ("max_output_tokens=32", "max_output_tokens=3"),
        ("batch_size=32", "batch_size=2"),
        ("max_steps=500", "max_steps=2"),
        ("evaluation_interval=25", "evaluation_interval=2"),
    ],
    "tutorials/tools.md": [
        *ON_CPU,
        ("max_tool_calls=3", "max_tool_calls=1"),
        ("max_model_len=1024", "max_model_len=192"),
        ("max_output_tokens=128", "max_output_tokens=4"),
        ("group_size=8", "group_size=2"),
        ("batch_size=64", "batch_size=4"),
        ("max_turns=4", "max_turns=2"),
        ("max_steps=200", "max_steps=2"),
        ("batch_size=8", "batch_size=2"),
    ],
    "tutorials/hpo.md": [
        *ON_CPU[1:],
        ('name = "Qwen/Qwen2.5-0.5B-Instruct"', f"name = {MODEL_DIR}"),
        ("data_batch_size_per_gpu=8", "data_batch_size_per_gpu=2"),
        ("group_size=8", "group_size=2"),
        ("batch_size=64", "batch_size=4"),
        ("micro_batch_size_per_gpu=8", "micro_batch_size_per_gpu=2"),
        ("max_output_tokens=256", "max_output_tokens=4"),
        ("max_model_len=768", "max_model_len=128"),
        ("max_steps=500", "max_steps=2"),
        ("evaluation_interval=25", "evaluation_interval=1"),
        ("evo_steps=50", "evo_steps=2"),
    ],
}


def _gsm8k() -> datasets.DatasetDict:
    def rows(pairs: list[tuple[int, int]]) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {
                "question": [f"what is {a}+{b}?" for a, b in pairs],
                "answer": [f"{a}+{b}={a + b}\n#### {a + b}" for a, b in pairs],
            }
        )

    return datasets.DatasetDict(
        {"train": rows([(1, 2), (3, 4), (5, 6), (7, 8)]), "test": rows([(2, 2), (4, 1)])}
    )


def _imdb() -> datasets.DatasetDict:
    review = "this movie was a great and fun film i liked the acting very much"
    texts = [review[i:] + " " + review[:i] for i in range(0, 30, 3)]
    return datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(10)]})}
    )


#: (path, config name) -> the local stand-in of what the pages download.
LOCAL_DATASETS: dict[tuple[str, str | None], Callable[[], Any]] = {
    ("openai/gsm8k", "main"): _gsm8k,
    ("stanfordnlp/imdb", None): _imdb,
}


def _local_load_dataset(path: str, name: str | None = None, **kwargs: Any) -> Any:
    split = kwargs.pop("split", None)
    if (path, name) not in LOCAL_DATASETS:
        raise AssertionError(f"no local copy of load_dataset({path!r}, {name!r}): add one")
    data = LOCAL_DATASETS[path, name]()
    return data if split is None else data[split]


def _gpu_block(page: str) -> tuple[Path, Any]:
    path = DOCS / page
    blocks = [b for b in python_blocks(path) if b.skip_reason is not None]
    assert len(blocks) == 1, f"{page}: expected one gpu-only block, found {len(blocks)}"
    return path, blocks[0]


def substituted(code: str, table: Table, dirs: dict[str, Path]) -> str:
    """``code`` with every substitution of ``table`` applied; each pattern must occur.

    ``dirs`` fills the placeholders (:data:`MODEL_DIR`, :data:`CLASSIFIER_DIR`) of the
    replacements with string literals of the directories.
    """
    for old, new in table:
        assert old in code, f"the docs block no longer contains {old!r}: update the table"
        literal = new
        for placeholder, directory in dirs.items():
            literal = literal.replace(placeholder, repr(str(directory)))
        code = code.replace(old, literal)
    return code


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    model, tokenizer = tiny_causal_lm("qwen2")
    save_tiny(model, tokenizer, directory)
    return directory


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight sequence classifier with ILQL's page's labels, and its tokenizer."""
    directory = tmp_path_factory.mktemp("tiny-classifier")
    tokenizer = char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **TINY_DEFAULTS,
        pad_token_id=tokenizer.pad_token_id,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
    )
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)
        classifier = Qwen2ForSequenceClassification(config)
    classifier.save_pretrained(str(directory))
    save_tokenizer(tokenizer, directory / TOKENIZER_SUBDIR)
    return directory


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory, no network, one thread, local datasets only."""
    monkeypatch.chdir(tmp_path)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setattr(datasets, "load_dataset", _local_load_dataset)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    yield tmp_path
    torch.set_num_threads(threads)


@pytest.fixture
def recomputations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per checkpointed layer recomputed in a backward (``rl_adapters.replay``)."""
    from rl_adapters import replay

    seen: list[int] = []
    enter = replay._Replay.__enter__

    def counted(self: Any) -> None:
        seen.append(1)
        enter(self)

    monkeypatch.setattr(replay._Replay, "__enter__", counted)
    return seen


@pytest.mark.parametrize("page", sorted(PAGES))
def test_gpu_example_trains_on_cpu(
    page: str, model_dir: Path, classifier_dir: Path, sandbox: Path, recomputations: list[int]
) -> None:
    path, block = _gpu_block(page)
    dirs = {MODEL_DIR: model_dir, CLASSIFIER_DIR: classifier_dir}
    code = substituted(block.code, PAGES[page], dirs)
    source = "\n" * (block.line - 1) + code  # tracebacks point at the Markdown lines
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    exec(compile(source, str(path), "exec"), namespace)
    if "gradient_checkpointing=True" in block.code:  # on, and the backward recomputed
        agent = namespace["agent"]
        assert agent.config.gradient_checkpointing
        # our checkpoint function is installed (rl_adapters.replay.enable_checkpointing);
        # transformers' own flag is named differently across the versions we admit
        assert agent.policy.causal_lm._rl_checkpoint == "reentrant"
        assert recomputations
    else:
        assert not recomputations
    (metrics,) = (sandbox / "runs").glob("*/metrics.jsonl")  # the block's one run directory
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows] == [1, 2]  # both steps trained ...
    for row in rows:  # ... with an applied update: a finite loss and gradient norm, no skip
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]), row
        assert "skipped_steps" not in row, row
    if "eval_fn=positive_rate" in block.code:  # ILQL's evaluation ran the classifier
        assert 0.0 <= rows[-1]["positive"] <= 1.0, rows[-1]
