"""Makes the test helper modules importable: ``tinker_testlib.py`` (a tiny model on disk and a
live tinker-server) and ``env_testlib.py`` (an ``env:`` run config).

The workspace runs pytest with ``--import-mode=importlib``, which does not put test folders on
``sys.path`` (the same arrangement as the rl-rollout and rl-adapters tests).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
