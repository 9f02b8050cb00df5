"""Makes ``kernels_testlib.py`` (naive references, input generators and comparison helpers)
importable from these tests, and runs each test with one intra-op thread.

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same trick as tests_integration/conftest.py).

The tensors here are tiny; on a loaded 2-core runner, intra-op thread hand-offs cost tens of
milliseconds per op (hundreds of seconds over the suite), so every test runs single-threaded
and the previous setting is restored afterwards.
"""

import sys
from pathlib import Path

from rl_testing.fixtures import single_torch_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["single_torch_thread"]  # autouse fixture, active for every test here
