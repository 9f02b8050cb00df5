import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tools/release.py is a stdlib-only script, importable as `release` in these tests.
sys.path.insert(0, str(ROOT / "tools"))
