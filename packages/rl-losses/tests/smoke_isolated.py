"""Run by `nox -s isolation` with `python -I` in a fresh venv holding only the built wheel of
rl-losses and its declared dependencies (torch): import it and do a small real computation.

It must not import anything from the workspace's tests.
"""

import importlib.util

import rl_losses as rl
import torch

FORBIDDEN = ("transformers", "peft", "accelerate", "datasets")
present = [name for name in FORBIDDEN if importlib.util.find_spec(name) is not None]
assert not present, f"rl-losses must install without {present}"

# PPO clip by hand: ratio 1.5 with A = +1 is clipped at 1.2, so the loss is -1.2, no gradient.
logprobs = torch.log(torch.tensor([[1.5]], dtype=torch.float64)).requires_grad_()
out = rl.clipped_surrogate(
    logprobs,
    torch.zeros(1, 1, dtype=torch.float64),
    torch.ones(1, dtype=torch.float64),
    torch.ones(1, 1, dtype=torch.bool),
)
out.loss.backward()
assert abs(out.loss.item() + 1.2) < 1e-12, out
assert logprobs.grad is not None and logprobs.grad.abs().item() == 0.0
assert out.clip_frac_high.item() == 1.0
print("rl_losses", rl.__version__, "ok:", rl.available_policy_losses())
