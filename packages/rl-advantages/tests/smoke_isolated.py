"""Run by `nox -s isolation` with `python -I` in a fresh venv holding only the built wheel of
rl-advantages and its declared dependencies (torch): import it and do a small real computation.

It must not import anything from the workspace's tests.
"""

import importlib.util

import rl_advantages as ra
import torch

FORBIDDEN = ("transformers", "peft", "accelerate", "datasets")
present = [name for name in FORBIDDEN if importlib.util.find_spec(name) is not None]
assert not present, f"rl-advantages must install without {present}"

# GRPO on two groups of two: (1, 0) -> (+1/sqrt(2), -1/sqrt(2)) with the unbiased std.
adv = ra.group_relative(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), group_size=2)
expected = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64) / 2**0.5
assert torch.allclose(adv, expected, atol=1e-5), adv

# GAE with lambda = 1 and zero values is the discounted return: [1, 0, 2], gamma 0.5.
rewards = torch.tensor([[1.0, 0.0, 2.0]])
mask = torch.ones(1, 3, dtype=torch.bool)
out = ra.gae(rewards, torch.zeros(1, 3), mask, gamma=0.5, lmbda=1.0)
assert torch.allclose(out.advantages, torch.tensor([[1.5, 1.0, 2.0]])), out
print("rl_advantages", ra.__version__, "ok:", len(ra.available_estimators()), "estimators")
