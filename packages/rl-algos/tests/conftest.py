import sys
from pathlib import Path

from rl_testing.fixtures import single_torch_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["single_torch_thread"]
