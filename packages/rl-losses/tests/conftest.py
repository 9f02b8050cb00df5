"""Makes ``ref_losses.py`` (loop references) and ``losses_testlib.py`` (input generators and
comparison helpers) importable from these tests.

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same trick as tests_integration/conftest.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
