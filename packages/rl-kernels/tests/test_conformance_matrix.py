"""Every public estimator and loss of rl_kernels has a well-formed row in the peer-conformance
matrix (tools/conformance/matrix.py, plain data: no peer venv needed), with a cell per peer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import rl_kernels

MATRIX_PY = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "matrix.py"


def test_every_public_function_has_a_well_formed_row() -> None:
    spec = importlib.util.spec_from_file_location("conformance_matrix", MATRIX_PY)
    assert spec is not None and spec.loader is not None, MATRIX_PY
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    assert matrix.problems(rl_kernels) == []
