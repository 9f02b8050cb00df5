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
# A GRPO loss on random tensors: group-relative advantages, clipped surrogate + k3 KL to the
# reference, per-sequence token means; forward checked against the formula, then backward.
g = torch.Generator().manual_seed(0)
B, G, T = 2, 4, 6
lp = (torch.randn(B * G, T, generator=g, dtype=torch.float64) * 0.1 - 1.0).requires_grad_()
old = lp.detach() + 0.05 * torch.randn(B * G, T, generator=g, dtype=torch.float64)
ref = lp.detach() + 0.05 * torch.randn(B * G, T, generator=g, dtype=torch.float64)
mask = torch.rand(B * G, T, generator=g) > 0.2
mask[:, 0] = True
r = torch.randn(B, G, generator=g, dtype=torch.float64)
adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1)
pg = rl.clipped_surrogate(lp, old, adv, mask, aggregation="seq_mean_token_mean")
kl = rl.kl_penalty(lp, ref, mask, kind="k3", coef=0.04, aggregation="seq_mean_token_mean")
(pg.loss + kl.loss).backward()
ratio = torch.exp(lp.detach() - old)
a = adv[:, None]
per_token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
expected = ((per_token * mask).sum(1) / mask.sum(1)).mean()
assert torch.allclose(pg.loss.detach(), expected, atol=1e-12), (pg.loss, expected)
assert lp.grad is not None and torch.isfinite(lp.grad).all()
assert lp.grad[~mask].abs().max() == 0 and lp.grad[mask].abs().sum() > 0
print("rl_losses", rl.__version__, "ok:", rl.available_policy_losses())
