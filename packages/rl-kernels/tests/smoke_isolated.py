"""Run by `nox -s isolation` with `python -I` in a fresh venv holding only the built wheels of
rl-kernels and rl-losses and their declared dependency (torch): import and compute.

It must not import anything from the workspace's tests.
"""

import importlib.util

import rl_kernels as rk
import torch

FORBIDDEN = ("transformers", "peft", "accelerate", "datasets")
present = [name for name in FORBIDDEN if importlib.util.find_spec(name) is not None]
assert not present, f"rl-kernels must install without {present}"

gen = torch.Generator().manual_seed(0)
hidden = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
weight = torch.randn(11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
targets = torch.randint(0, 11, (2, 5), generator=gen)
mask = torch.ones(2, 5, dtype=torch.bool)
# chunked log-probs equal the full-logits ones
logp = rk.fused_logprobs(hidden.reshape(10, 8), weight, targets.reshape(10), chunk_rows=3)
full = torch.log_softmax(hidden.reshape(10, 8) @ weight.T, -1).gather(1, targets.reshape(10, 1))
assert torch.allclose(logp, full.squeeze(1), atol=1e-12)
out = rk.fused_policy_loss(hidden, weight, targets, mask, torch.tensor([1.0, -1.0]), chunk_rows=3)
out.loss.backward()
assert hidden.grad is not None and weight.grad is not None
# A GRPO loss (clipped surrogate + beta * k3 KL, per-sequence token means) through the fused
# kernel equals the plain rl-losses composition on full logits, value and gradients.
import rl_losses as rl  # noqa: E402  (rl-kernels' one workspace dependency)

old = full.detach().reshape(2, 5) + 0.05 * torch.randn(2, 5, generator=gen, dtype=torch.float64)
ref = old + 0.05 * torch.randn(2, 5, generator=gen, dtype=torch.float64)
adv = torch.tensor([0.7, -0.7], dtype=torch.float64)
h1, w1 = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
h2, w2 = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
kw = {"aggregation": "seq_mean_token_mean"}
fused = rk.fused_policy_loss(
    h1, w1, targets, mask, adv, old, ref, kl_coef=0.04, kl_kind="k3", chunk_rows=3, **kw
)
fused.loss.backward()
lp = torch.log_softmax(h2 @ w2.T, -1).gather(-1, targets[..., None])[..., 0]
plain = rl.clipped_surrogate(lp, old, adv, mask, **kw).loss
plain = plain + rl.kl_penalty(lp, ref, mask, kind="k3", coef=0.04, **kw).loss
plain.backward()
assert torch.allclose(fused.loss.detach(), plain.detach(), atol=1e-12), (fused.loss, plain)
assert torch.allclose(h1.grad, h2.grad, atol=1e-12) and torch.allclose(w1.grad, w2.grad, atol=1e-12)
print("rl_kernels", rk.__version__, "ok:", out.metrics()["loss"], "grpo:", float(plain.detach()))
