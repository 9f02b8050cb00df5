"""Makes ``adapters_testlib.py`` (tiny models, LoRA configs, parameter snapshots and checkpoint
helpers) importable from these tests, and runs each test with one intra-op thread.

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same trick as tests_integration/conftest.py).

The models are tiny (hidden 64, 2 layers); on a loaded 2-core runner intra-op thread hand-offs
cost more than the arithmetic, and a fixed thread count also keeps the CPU results
bit-reproducible between the two branches of the "step after a round trip" tests.
"""

import sys
from pathlib import Path

from rl_testing.fixtures import single_torch_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["single_torch_thread"]  # autouse fixture, active for every test here
