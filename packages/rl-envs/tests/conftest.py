"""Puts this folder on ``sys.path`` (the workspace uses ``--import-mode=importlib``) for
``envs_testlib.py``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
