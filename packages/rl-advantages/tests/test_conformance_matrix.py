"""Every public estimator and loss of rl_advantages has a row in the peer-conformance matrix
(tools/conformance/matrix.py, plain data: no peer venv needed), with a cell per peer."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import rl_advantages

MATRIX_PY = Path(__file__).resolve().parents[3] / "tools" / "conformance" / "matrix.py"
STATUSES = {"equal", "args", "design", "none"}


def _matrix() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_matrix", MATRIX_PY)
    assert spec is not None and spec.loader is not None, MATRIX_PY
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_function_is_in_the_matrix() -> None:
    matrix = _matrix()
    missing = matrix.missing("rl_advantages", list(rl_advantages.__all__))
    assert not missing, (
        f"add a row per peer to tools/conformance/matrix.py (MATRIX) for {missing}, or list "
        "them in EXEMPT if they are not estimators or losses"
    )


def test_matrix_cells_are_well_formed() -> None:
    matrix = _matrix()
    rows = {k: v for k, v in matrix.MATRIX.items() if k.startswith("rl_advantages.")}
    assert rows
    for name, row in rows.items():
        assert hasattr(rl_advantages, name.split(".", 1)[1]), (
            f"{name} is in the matrix but not public"
        )
        for peer, (status, text, cases) in row.items():
            assert status in STATUSES, (name, peer, status)
            assert text.strip(), (name, peer)
            assert status != "none" or not cases, (name, peer)
