"""Makes ``adapters_testlib.py`` (tiny models, LoRA configs, parameter snapshots and checkpoint
helpers) importable from these tests, and runs each test with one intra-op thread.

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same trick as tests_integration/conftest.py).

The models are tiny (hidden 64, 2 layers); on a loaded 2-core runner intra-op thread hand-offs
cost more than the arithmetic, and a fixed thread count also keeps the CPU results
bit-reproducible between the two branches of the "step after a round trip" tests.
"""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
