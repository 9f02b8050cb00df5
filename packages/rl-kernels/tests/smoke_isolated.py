"""Run by `nox -s isolation` with `python -I` in a fresh venv holding only the built wheel of
rl-kernels and its declared dependencies: import it and do a small real computation.

Extend this as the package's API grows; it must not import anything from the workspace's tests.
"""

import importlib.util

import rl_kernels
import torch

FORBIDDEN = ("transformers", "peft", "accelerate", "datasets")

present = [name for name in FORBIDDEN if importlib.util.find_spec(name) is not None]
assert not present, f"rl-kernels must install without {present}"

x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
logp = torch.log_softmax(x, dim=-1)
assert torch.allclose(logp.exp().sum(-1), torch.ones(4, dtype=torch.float64))
print("rl_kernels", rl_kernels.__version__, "ok")
