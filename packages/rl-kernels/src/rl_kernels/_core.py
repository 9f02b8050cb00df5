r"""The per-chunk math shared by the fused kernels: logits, log-softmax and its gradient.

The softmax runs in base 2 where ``exp2`` is the cheaper exponential (:func:`exp2_faster`: on
CPUs whose PyTorch kernels are AVX2 or AVX-512; measured in ``docs/benchmarks.md``), in base e
elsewhere. In base 2 the logits are :math:`u = z \log_2 e` (:math:`z` the
logits divided by the temperature) and :math:`p = 2^{u - \mathrm{lse}_2(u)}` is the same softmax;
flash-attention computes its softmax the same way. The factor :math:`\log_2 e / \tau` (or
:math:`1 / \tau`) is the GEMM's ``alpha``: it costs no pass over a tile and no rounding beyond
the one of the GEMM's result. Log-sum-exps stay in the tile's base inside the kernels; log-probs
and entropies leave them in nats.

Tiles are ``[c, V]``. Without entropies one tile suffices: the logits are turned into
probabilities in place, then into the logits gradient in place. Entropies need the raw
logits next to the probabilities (two tiles): computing them from ``log p`` instead would
give ``0 * -inf`` where a probability underflows.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: :math:`\log_2 e` and :math:`\ln 2`: nats to base-2 units and back.
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

#: ``torch.backends.cpu.get_cpu_capability()`` values whose vectorised ``exp2`` is faster than
#: ``exp``. With PyTorch's ``DEFAULT`` kernels ``exp2`` is the slower one, and on CUDA both are
#: one pass over memory: there the kernels stay in base e.
EXP2_CPU_CAPABILITIES = frozenset({"AVX2", "AVX512"})


def exp2_faster(device: torch.device) -> bool:
    """Whether the kernels' tiles on ``device`` compute in base 2 (the module docstring)."""
    return device.type == "cpu" and torch.backends.cpu.get_cpu_capability() in EXP2_CPU_CAPABILITIES


def compute_dtype(dtype: torch.dtype, upcast: bool) -> torch.dtype:
    """fp32 (or fp64 for fp64 inputs) when ``upcast``, else the input dtype."""
    if not upcast:
        return dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


HALF = (torch.float16, torch.bfloat16)


def half_gemms_default(hidden: torch.Tensor, weight: torch.Tensor, upcast: bool) -> bool:
    """The default of the kernels' ``half_gemms``: on CUDA, for fp16/bf16 inputs with ``upcast``."""
    return upcast and hidden.is_cuda and hidden.dtype in HALF and weight.dtype == hidden.dtype


class HeadGemms:
    r"""The head's three products for a chunk of rows, with results in the compute dtype ``cd``.

    .. math:: u = (h W^\top + b)\, k / \tau \;[c, V], \qquad \partial h = g W \;[c, H],
              \qquad \partial W \mathrel{+}= g^\top h \;[V, H]

    where ``u`` are the logits in the tiles' base (the module docstring: ``units`` :math:`k` is
    :math:`\log_2 e` in base 2, else 1) and ``g`` [c, V] is the gradient w.r.t. the raw logits
    :math:`h W^\top + b`. Without ``half`` every operand is
    in ``cd`` (for half-precision inputs with ``upcast`` the weight is cast to fp32 once: an
    extra ``V x H`` buffer, and fp32 GEMMs). With ``half`` (fp16/bf16 ``h`` and ``W``,
    ``upcast``) the operands keep their dtype and each product accumulates and returns in fp32:
    ``torch.mm(..., out_dtype=torch.float32)`` on CUDA, elsewhere the same products with the
    operands upcast per call (a product of two half-precision numbers is exact in fp32, so both
    give the fp32 GEMM's logits up to summation order). The logits gradient ``g`` is rounded to
    the input dtype for the two backward products, as an unfused half-precision model's
    backward rounds it; the softmax and the loss stay in fp32.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, cd: torch.dtype, half: bool
    ) -> None:
        if half and (weight.dtype not in HALF or cd != torch.float32):
            raise ValueError(
                f"`half_gemms=True` needs a float16/bfloat16 weight and `upcast=True`, got "
                f"weight {weight.dtype} computing in {cd}"
            )
        self.cd, self.half = cd, half
        #: the tiles' base (:func:`exp2_faster`) and the factor from nats to its units
        self.base2 = exp2_faster(weight.device)
        self.units = LOG2E if self.base2 else 1.0
        self.w = weight if half else weight.to(cd)
        self.b = bias.to(cd) if bias is not None else None

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        """A chunk of hidden states in the GEMMs' operand dtype."""
        return h.to(self.w.dtype)

    def _mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` in fp32 from half-precision operands."""
        if a.is_cuda:
            return torch.mm(a, b, out_dtype=self.cd)
        return torch.mm(a.to(self.cd), b.to(self.cd))

    def logits(
        self, h: torch.Tensor, temperature: float, cols: slice | None = None
    ) -> torch.Tensor:
        r"""``(h @ W.T + b) * units / temperature``: [c, H] -> [c, V] logits in ``cd``.

        In the tiles' base (``units`` is :math:`\log_2 e` in base 2, else 1); only the ``cols``
        of V when given. The factor is the GEMM's ``alpha`` (and ``beta`` for the bias), except
        for half-precision GEMMs on CUDA, which scale their fp32 result.
        """
        w = self.w if cols is None else self.w[cols]
        b = self.b if (cols is None or self.b is None) else self.b[cols]
        scale = self.units / temperature
        if self.half and h.is_cuda:
            z = torch.mm(h, w.T, out_dtype=self.cd)
            if b is not None:
                z.add_(b)
            return z.mul_(scale) if scale != 1.0 else z
        if self.half:  # the same products from fp32 copies of the operands (see the class)
            h, w = h.to(self.cd), w.to(self.cd)
        if scale == 1.0:
            return torch.addmm(b, h, w.T) if b is not None else torch.mm(h, w.T)
        if b is not None:
            return torch.addmm(b, h, w.T, beta=scale, alpha=scale)
        return torch.addmm(h.new_zeros(()), h, w.T, beta=0.0, alpha=scale)

    def exp(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tiles' exponential (``exp2`` or ``exp``), into ``out`` if given (``x`` too)."""
        fn = torch.exp2 if self.base2 else torch.exp
        return fn(x) if out is None else fn(x, out=out)

    def input_grad(
        self, g: torch.Tensor, out: torch.Tensor | None = None, cols: slice | None = None
    ) -> torch.Tensor:
        """``g @ W``: [c, V] (or the ``cols`` of V) -> [c, H] in ``cd`` (to ``out`` if given)."""
        w = self.w if cols is None else self.w[cols]
        if not self.half:
            return torch.mm(g, w, out=out) if out is not None else torch.mm(g, w)
        res = self._mm(g.to(w.dtype), w)
        if out is None:
            return res
        return out.copy_(res)

    def add_weight_grad(self, grad_w: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> None:
        """``grad_w += g.T @ h`` ([V, H], in ``cd``), in place."""
        if not self.half:
            grad_w.addmm_(g.T, h)
            return
        g = g.to(self.w.dtype)
        if grad_w.is_cuda and _ADDMM_INTO_FP32[0]:
            try:  # accumulate into the fp32 buffer in place: no [V, H] temporary
                torch.addmm(grad_w, g.T, h, out_dtype=self.cd, out=grad_w)
                return
            except (RuntimeError, TypeError):
                _ADDMM_INTO_FP32[0] = False
        grad_w.addmm_(g.T.to(self.cd), h.to(self.cd))  # fp32 GEMM, still no [V, H] temporary


#: Whether ``torch.addmm(fp32, half, half, out_dtype=float32, out=fp32)`` works here: set to
#: False at the first failure, after which the weight gradient's product runs in fp32.
_ADDMM_INTO_FP32 = [True]


def softmax_(
    u: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool,
    normalize: bool = True,
    base2: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    r"""Log-prob of ``targets``, log-sum-exp, entropy and probabilities of a logits chunk.

    ``u`` [c, V] are logits in base 2 (``base2``, :meth:`HeadGemms.logits`) or e; with
    :math:`b` that base and :math:`\ln b` its natural log,

    .. math:: \mathrm{lse}_b = \log_b \textstyle\sum_v b^{u_v}, \qquad
              \log p_y = (u_y - \mathrm{lse}_b) \ln b, \qquad
              H = -\textstyle\sum_v p_v \log p_v

    Returns:
        ``(logp [c], lse [c], entropy [c] or None, p [c, V])``: log-prob and entropy in nats,
        ``lse`` in the base of ``u``. Without ``with_entropy`` the probabilities overwrite
        ``u``. With it, ``u`` is overwritten by the log-probabilities :math:`u - \mathrm{lse}_b`
        in its base (finite even where :math:`p` underflows, and free of the cancellation of
        :math:`\mathrm{lse} - \sum p z` on peaked rows) and ``p`` is a new tile.
        ``normalize=False`` (only without ``with_entropy``) skips the division by the row sums,
        a full pass over the tile, for a caller that reads only ``logp`` and ``lse``: ``p``
        then holds :math:`b^{u - \max u}`.
    """
    exp, log, nats = (torch.exp2, torch.log2, LN2) if base2 else (torch.exp, torch.log, 1.0)
    u_target = u.gather(1, targets[:, None]).squeeze(1)
    top = u.amax(dim=1)
    u.sub_(top[:, None])
    p = exp(u) if with_entropy else exp(u, out=u)
    total = p.sum(dim=1)
    log_total = log(total)
    if normalize or with_entropy:
        p.div_(total[:, None])
    lse = top + log_total
    entropy = None
    if with_entropy:
        logp_all = u.sub_(log_total[:, None])
        entropy = torch.linalg.vecdot(p, logp_all).mul_(-nats)
    logp = u_target - lse
    return (logp.mul_(nats) if base2 else logp), lse, entropy, p


def entropy_coeff_(
    logp_all: torch.Tensor,
    entropy: torch.Tensor,
    g_entropy: torch.Tensor,
    g_logp: torch.Tensor,
    base2: bool,
) -> torch.Tensor:
    r"""The coefficient of :math:`-p` in the logits gradient, in place of ``logp_all`` [c, V].

    .. math:: g_{\log p} + g_H (\log p + H)
              = g_{\log p} + (g_H \ln 2) (\log_2 p + H \log_2 e) \quad \text{(base 2)}

    ``logp_all`` are the log-probabilities in the tiles' base; ``entropy``, ``g_entropy`` and
    ``g_logp`` [c] are in nats.
    """
    if base2:
        logp_all.add_(entropy[:, None] * LOG2E).mul_(g_entropy[:, None] * LN2)
    else:
        logp_all.add_(entropy[:, None]).mul_(g_entropy[:, None])
    return logp_all.add_(g_logp[:, None])


def logits_grad_(
    p: torch.Tensor,
    logp_all: torch.Tensor | None,
    targets: torch.Tensor,
    g_logp: torch.Tensor,
    entropy: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
    base2: bool = False,
) -> torch.Tensor:
    r"""Gradient w.r.t. the raw logits of one chunk, computed in place of ``p`` (and ``logp_all``).

    .. math:: \frac{\partial \log p_y}{\partial z_k} = \mathbb 1[k = y] - p_k, \qquad
              \frac{\partial H}{\partial z_k} = -p_k(\log p_k + H)

    The temperature divides both (the logits were ``raw / temperature``). ``logp_all`` (the
    chunk's log-probabilities in the tiles' base: :math:`\log p = \ln 2 \cdot \log_2 p` with
    ``base2``) is needed only for the entropy term.
    """
    if entropy is not None and g_entropy is not None:
        if logp_all is None:
            raise ValueError("the entropy gradient needs the log-probabilities `logp_all`")
        grad = p.mul_(entropy_coeff_(logp_all, entropy, g_entropy, g_logp, base2)).neg_()
    else:
        grad = p.mul_(g_logp[:, None]).neg_()
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, targets] += g_logp
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


_COMPILED: dict[str, Any] = {}


def chunk_ops(compile_body: bool) -> tuple[Any, Any]:
    """``(softmax_, logits_grad_)``, or their ``torch.compile``-d versions (built once)."""
    if not compile_body:
        return softmax_, logits_grad_
    if not _COMPILED:
        _COMPILED["softmax_"] = torch.compile(softmax_, dynamic=True)
        _COMPILED["logits_grad_"] = torch.compile(logits_grad_, dynamic=True)
    return _COMPILED["softmax_"], _COMPILED["logits_grad_"]
