import sys
from pathlib import Path

from rl_testing.fixtures import single_torch_thread

ROOT = Path(__file__).resolve().parents[1]
# tools/release.py is a stdlib-only script, importable as `release` in these tests.
sys.path.insert(0, str(ROOT / "tools"))
# this folder's plain modules (learning_table.py, bad_inputs.py), importable by name.
sys.path.insert(0, str(ROOT / "tests_integration"))

# autouse: one intra-op torch thread in every test here, as in the packages' unit tests (and as
# the learning table's budgets were measured, docs/testing.md)
__all__ = ["single_torch_thread"]
