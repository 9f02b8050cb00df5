"""Makes ``rollout_testlib.py`` (tiny models, scripted logits processors, the result invariants and
the trainer-side log-prob recomputation) importable from these tests, and runs each test with one
intra-op thread.

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same trick as the rl-adapters tests).

The models are tiny (hidden 64, 2 layers); on a loaded 2-core runner intra-op thread hand-offs
cost more than the arithmetic, and a fixed thread count keeps the CPU results bit-reproducible
between the generation and the teacher-forced recomputation.
"""

import sys
from pathlib import Path

from rl_testing.fixtures import single_torch_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["single_torch_thread"]  # autouse fixture, active for every test here
