"""The checks each package's tests run on its rows of the conformance matrix (``matrix.py``).

Plain Python, no peer venv: ``problems(rl_losses)`` lists what is wrong with ``rl_losses``'
rows, and each of rl-advantages, rl-losses and rl-kernels asserts it is empty
(``tests/test_conformance_matrix.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

STATUSES = frozenset({"equal", "args", "design", "none"})
"""The statuses a cell may have (see ``matrix.py``'s module docstring)."""


#: Public names that are not estimators or losses (plumbing, statistics, registries, types),
#: or that restate one with a row (``rollout_weights``: ``rollout_correction``'s weights and mask,
#: equal bit for bit in rl-losses' property tests).
EXEMPT = {
    "rl_advantages": {
        "AdvantagesReturns", "TurnValues", "available_estimators", "broadcast_to_tokens",
        "get_estimator", "masked_mean", "masked_sum", "masked_var", "pool_to_turns",
        "register_estimator", "turn_mask_from_ids",
    },
    "rl_losses": {
        "AGGREGATIONS", "Aggregation", "EntropyOutput", "ILQLLossOutput", "KLKind", "KLOutput",
        "Level", "PolicyLossOutput", "Pooling", "RolloutCorrection", "TargetReduction",
        "ValueLossOutput", "available_policy_losses", "get_policy_loss", "next_state_values",
        "register_policy_loss", "rollout_weights", "to_units",
    },
    "rl_kernels": {
        "DEFAULT_MEMORY_BUDGET", "FUSED_OBJECTIVES", "FusedPolicyLossOutput",
        "LigerPolicyLossOutput", "auto_chunk_rows", "fused_logprobs", "sum_pi_squared",
    },
}  # fmt: skip


def missing(matrix: ModuleType, module: str, public: list[str]) -> list[str]:
    """Public names of ``module`` that are neither exempt nor complete rows of the matrix."""
    out = []
    for name in public:
        if name.startswith("_") or name in EXEMPT.get(module, set()):
            continue
        row = matrix.MATRIX.get(f"{module}.{name}")
        if row is None or set(row) != set(matrix.PEERS):
            out.append(name)
    return out


def load_matrix() -> ModuleType:
    """``matrix.py`` next to this file, imported by path (``tools/`` is not a package)."""
    path = Path(__file__).resolve().with_name("matrix.py")
    spec = importlib.util.spec_from_file_location("conformance_matrix", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the conformance matrix from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problems(module: ModuleType) -> list[str]:
    """What is wrong with ``module``'s rows (an imported package such as ``rl_losses``).

    Its public names missing from ``MATRIX`` (neither exempt nor a row with a cell per peer),
    rows of names it does not export, and malformed cells (unknown status, empty text, cases on
    a "none" cell). Empty when all is well.
    """
    matrix = load_matrix()
    name = module.__name__
    out = [
        f"{n}: add a row per peer to tools/conformance/matrix.py (MATRIX), or list it in EXEMPT"
        f" (tools/conformance/check.py)"
        for n in missing(matrix, name, list(module.__all__))
    ]
    rows = {k: v for k, v in matrix.MATRIX.items() if k.startswith(f"{name}.")}
    if not rows:
        out.append(f"no rows for {name} in tools/conformance/matrix.py (MATRIX)")
    for key, row in rows.items():
        if not hasattr(module, key.split(".", 1)[1]):
            out.append(f"{key} is in the matrix but {name} does not export it")
        for peer, (status, text, cases) in row.items():
            if status not in STATUSES or not text.strip() or (status == "none" and cases):
                out.append(f"{key} / {peer}: malformed cell ({status!r}, {text!r}, {cases!r})")
    return out
