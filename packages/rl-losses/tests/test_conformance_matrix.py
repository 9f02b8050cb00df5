"""Every public estimator and loss of rl_losses has a well-formed row in the peer-conformance
matrix (tools/conformance/matrix.py, plain data: no peer venv needed), with a cell per peer;
the checks are tools/conformance/check.py's, shared by the three packages that have rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import rl_losses

CHECK_PY = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "check.py"


def test_every_public_function_has_a_well_formed_row() -> None:
    spec = importlib.util.spec_from_file_location("conformance_check", CHECK_PY)
    assert spec is not None and spec.loader is not None, CHECK_PY
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.problems(rl_losses) == []
