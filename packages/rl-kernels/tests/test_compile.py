"""The opt-in torch.compile of the chunk body gives the eager results (slow: it compiles)."""

import pytest
import rl_kernels as rk
import torch
from rl_testing.tolerance import assert_close


@pytest.mark.slow
@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="ATEN_CPU_CAPABILITY=default: inductor's C++ for CPU reductions still names at::vec "
    "without its header ('at::vec has not been declared'), whatever our code",
)
@pytest.mark.parametrize("with_entropy", [False, True])
def test_compiled_chunk_body_matches_eager(with_entropy: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 8, 16, generator=gen)
    weight = torch.randn(97, 16, generator=gen)
    targets = torch.randint(0, 97, (3, 8), generator=gen)
    mask = torch.rand(3, 8, generator=gen) > 0.2
    adv = torch.randn(3, generator=gen)
    results = []
    for compile_body in (False, True):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        logp = rk.fused_logprobs(
            h.reshape(-1, 16), w, targets.reshape(-1), chunk_rows=8, with_entropy=with_entropy,
            compile=compile_body,
        )  # fmt: skip
        total = logp[0].sum() + logp[1].sum() if isinstance(logp, tuple) else logp.sum()
        out = rk.fused_policy_loss(
            h, w, targets, mask, adv, chunk_rows=8, entropy_coef=0.01 if with_entropy else 0.0,
            compile=compile_body,
        )  # fmt: skip
        (total + out.loss).backward()
        results.append((total.detach(), out.loss.detach(), h.grad, w.grad))
    for eager, compiled in zip(*results, strict=True):
        assert compiled is not None and eager is not None
        # logits over H = 16, log-sum-exp over V = 97, then the sums over tokens / rows
        assert_close(compiled, eager, reduction=97, stages=3)
