"""Every Python example of the documentation site runs (docs that cannot rot).

For each page under ``docs/``, its ```python blocks run in order in one namespace, in a fresh
temporary working directory, on CPU with downloads disabled. Only blocks marked
``<!-- docs: gpu-only: REASON -->`` are left out (see ``rl_testing.docs`` and the "Writing
docs" page); a marker without a reason, or one not in front of a python block, fails.
"""

from __future__ import annotations

import contextlib
import importlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from rl_testing.docs import marker_problems, python_blocks, run_python_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
RUNNABLE = [p for p in PAGES if any(b.skip_reason is None for b in python_blocks(p))]


def _name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


#: The process-wide tables that pages extend (the algorithm table, the objective, estimator,
#: engine and trainer registries): restored after each page, so that a row a page registers
#: (``grpo_clip_higher`` in architecture.md) is not seen by tests that later share the process.
REGISTRIES = (
    ("rl_algos.names", "_ROWS"),
    ("rl_losses.registry", "_LOSSES"),
    ("rl_advantages.registry", "_ESTIMATORS"),
    ("rl_rollout.engine", "_ENGINES"),
    ("rl_train.trainer", "_TRAINERS"),
)


@contextlib.contextmanager
def restored_registries() -> Iterator[None]:
    """Run the block, then put every table of :data:`REGISTRIES` back as it was."""
    tables = [vars(importlib.import_module(m))[name] for m, name in REGISTRIES]
    saved = [dict(t) for t in tables]
    try:
        yield
    finally:
        for table, before in zip(tables, saved, strict=True):
            table.clear()
            table.update(before)


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory, no network, no display, two threads; registries restored."""
    monkeypatch.chdir(tmp_path)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    random.seed(0)
    torch.manual_seed(0)
    with restored_registries():
        yield tmp_path
    torch.set_num_threads(threads)


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_examples_run(page: Path, sandbox: Path) -> None:
    run_python_blocks(page, {"__name__": "__docs__"})


def test_registries_are_restored_after_a_page() -> None:
    # architecture.md registers `grpo_clip_higher`; tests that share the process afterwards
    # (rl-train's example check, when every suite runs in one pytest) must not see it
    import rl_losses
    from rl_algos import ALGORITHMS, AlgorithmSpec, register_algorithm

    row = AlgorithmSpec("docs_sandbox_row", "GRPO", {}, "registered by a page")
    with restored_registries():
        register_algorithm(row)
        rl_losses.register_policy_loss("docs_sandbox_loss")(lambda **_: None)
        assert row.name in ALGORITHMS and "docs_sandbox_loss" in rl_losses.available_policy_losses()
    assert row.name not in ALGORITHMS
    assert "docs_sandbox_loss" not in rl_losses.available_policy_losses()


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_page_markers_are_well_formed(page: Path) -> None:
    assert marker_problems(page) == []


def test_gpu_only_blocks_compile() -> None:
    """Blocks that do not run must still be valid Python."""
    for page in PAGES:
        for block in python_blocks(page):
            if block.skip_reason is not None:
                compile("\n" * (block.line - 1) + block.code, str(page), "exec")


def test_the_site_has_examples_and_gpu_only_blocks_say_why() -> None:
    blocks = [b for p in PAGES for b in python_blocks(p)]
    skipped = [b for b in blocks if b.skip_reason is not None]
    assert len(blocks) - len(skipped) >= 30  # most examples run
    assert all(b.skip_reason.strip() for b in skipped)  # type: ignore[union-attr]


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may hold ``!!python/name:`` tags; they are read as None here."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def test_every_page_is_in_the_nav_and_the_build_is_strict() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    assert config["strict"] is True
    assert {_name(p) for p in PAGES} == set(_nav_pages(config["nav"]))
