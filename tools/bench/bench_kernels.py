"""lm_head -> log-prob -> PPO loss, forward + backward: naive vs fused vs Liger, on CPU fp32.

Each (case, variant) runs in a fresh subprocess so that its peak resident memory (max RSS,
minus the RSS after the inputs exist) is its own. Variants:

* ``naive``: full ``[M, V]`` logits, ``log_softmax``, gather, ``rl_losses.clipped_surrogate``.
* ``fused_logprobs``: ``rl_kernels.fused_logprobs`` then ``rl_losses.clipped_surrogate``.
* ``fused_policy_loss``: ``rl_kernels.fused_policy_loss`` (default 256 MiB tile budget) and
  ``fused_policy_loss@64MiB`` (a 64 MiB budget).
* ``liger``: ``liger_kernel.chunked_loss.LigerFusedLinearGRPOLoss(compiled=False, beta=0,
  loss_type="dapo")``, when liger-kernel is installed (``rl-kernels[liger]``).
* ``floor``: the three bare GEMMs of forward and backward into preallocated buffers.
* ``naive@frozen`` and ``fused_logprobs@frozen``: the same with the head frozen (LoRA), so only
  the hidden states get a gradient; their ``vs_naive_frozen`` is the time against
  ``naive@frozen``.

Tokens are laid out as sequences of 512 (Liger chunks by sequence, one per chunk).
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import Row, Timing, with_ratios

CASES = [(512, 512, 32000), (4096, 512, 32000), (8192, 1024, 32000)]  # (M, H, V)
QUICK_CASES = [(512, 256, 8000), (2048, 256, 8000)]
VARIANTS = [
    "naive", "fused_logprobs", "fused_policy_loss", "fused_policy_loss@64MiB", "liger", "floor",
    "naive@frozen", "fused_logprobs@frozen",
]  # fmt: skip
SEQ = 512


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _worker(variant: str, m: int, h: int, v: int, repeats: int, warmup: int) -> dict[str, object]:
    import rl_kernels as rk
    import rl_losses as rl
    import torch

    torch.manual_seed(0)
    n, t = max(m // SEQ, 1), min(m, SEQ)
    hidden = torch.randn(n, t, h) * 0.5
    weight = torch.randn(v, h) * 0.05
    targets = torch.randint(0, v, (n, t))
    mask = torch.ones(n, t, dtype=torch.bool)
    adv = torch.randn(n)
    # behaviour log-probs near the uniform policy's, without a logits-sized setup transient
    old = torch.full((n, t), -math.log(v)) + 0.1 * torch.randn(n, t)
    kw = {"clip_low": 0.2, "clip_high": 0.28}

    frozen = variant.endswith("@frozen")  # the head gets no gradient (LoRA)
    variant = variant.removesuffix("@frozen")
    hidden_leaf, weight_leaf = hidden.requires_grad_(), weight.requires_grad_(not frozen)

    def leaves() -> tuple[torch.Tensor, torch.Tensor]:
        hidden_leaf.grad = weight_leaf.grad = None
        return hidden_leaf, weight_leaf

    if variant == "naive":

        def step() -> None:
            hh, ww = leaves()
            logp = torch.log_softmax(hh @ ww.T, -1).gather(-1, targets[..., None]).squeeze(-1)
            rl.clipped_surrogate(logp, old, adv, mask, **kw).loss.backward()

    elif variant == "fused_logprobs":

        def step() -> None:
            hh, ww = leaves()
            logp = rk.fused_logprobs(hh.reshape(-1, h), ww, targets.reshape(-1))
            assert isinstance(logp, torch.Tensor)
            rl.clipped_surrogate(logp.view(n, t), old, adv, mask, **kw).loss.backward()

    elif variant.startswith("fused_policy_loss"):
        budget = 64 * 2**20 if variant.endswith("@64MiB") else rk.DEFAULT_MEMORY_BUDGET

        def step() -> None:
            hh, ww = leaves()
            out = rk.fused_policy_loss(hh, ww, targets, mask, adv, old, memory_budget=budget, **kw)
            out.loss.backward()

    elif variant == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        loss_fn = LigerFusedLinearGRPOLoss(
            beta=0.0, compiled=False, use_ref_model=False, epsilon_low=0.2, epsilon_high=0.28,
            loss_type="dapo", chunk_size=1,
        )  # fmt: skip

        def step() -> None:
            hh, ww = leaves()
            out = loss_fn(hh, ww, targets, mask.long(), adv, old_per_token_logps=old)
            (out[0] if isinstance(out, tuple) else out).backward()

    else:  # floor
        hh, ww = hidden.detach().reshape(-1, h), weight.detach()
        logits = torch.empty(m, v)
        dlogits = torch.randn(m, v)
        dlogits_t = dlogits.T.contiguous()  # so the third GEMM needs no transposed copy
        gh, gw = torch.empty(m, h), torch.empty(v, h)

        def step() -> None:
            torch.mm(hh, ww.T, out=logits)
            torch.mm(dlogits, ww, out=gh)
            torch.mm(dlogits_t, hh, out=gw)

    base = _rss_bytes()
    samples = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        step()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return {"samples": samples, "peak_extra_bytes": _rss_bytes() - base}


def _liger_available() -> bool:
    try:
        import liger_kernel.chunked_loss  # noqa: F401
    except Exception:
        return False
    return True


def run(quick: bool) -> list[Row]:
    cases = QUICK_CASES if quick else CASES
    repeats, warmup = (2, 1) if quick else (3, 1)
    rows: list[Row] = []
    for m, h, v in cases:
        case = f"M={m} H={h} V={v} fp32"
        for variant in VARIANTS:
            if variant == "liger" and not _liger_available():
                continue
            args = [variant, str(m), str(h), str(v), str(repeats), str(warmup)]
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", *args],
                capture_output=True, text=True, check=False, env=env,
            )  # fmt: skip
            if proc.returncode != 0:
                print(f"{case} {variant}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            peak = int(result["peak_extra_bytes"]) / 2**20
            rows.append(Row("kernels", case, variant, Timing(list(result["samples"])),
                            extra={"peak_extra_MiB": round(peak, 1)}))  # fmt: skip
            print(f"  {case} {variant}: median {statistics.median(result['samples']):.3f} s, "
                  f"peak extra {peak:.0f} MiB", file=sys.stderr, flush=True)  # fmt: skip
    rows = with_ratios(rows, baseline="naive", floor="floor")
    for r in rows:
        frozen = next(
            (x for x in rows if x.case == r.case and x.variant == "naive@frozen"), None
        )  # fmt: skip
        if r.variant.endswith("@frozen") and frozen is not None:
            r.extra["vs_naive_frozen"] = round(r.timing.median / frozen.timing.median, 3)
    for r in rows:
        base = next((x for x in rows if x.case == r.case and x.variant == "naive"), None)
        if base is not None and base.extra["peak_extra_MiB"]:
            r.extra["mem_vs_naive"] = round(
                r.extra["peak_extra_MiB"] / base.extra["peak_extra_MiB"], 3
            )
    return rows


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    variant, m, h, v, repeats, warmup = sys.argv[2], *map(int, sys.argv[3:8])
    print(json.dumps(_worker(variant, m, h, v, repeats, warmup)))
