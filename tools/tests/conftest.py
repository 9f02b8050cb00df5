"""tools/tests: the stdlib scripts of tools/ (affected.py, release.py) and the CI workflows."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# tools/affected.py and tools/release.py are stdlib-only scripts, importable by name here.
sys.path.insert(0, str(ROOT / "tools"))
