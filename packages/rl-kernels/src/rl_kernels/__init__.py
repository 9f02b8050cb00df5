"""rl-kernels: memory-bounded fused lm_head -> log-prob, entropy and policy loss.

The largest tensor of LLM RL is the logits, ``N*T x V``. These kernels compute per-token
log-probs, entropies and the whole token-level policy loss from the last hidden states and the
lm_head weight, chunk by chunk, so full logits never exist in the forward or the backward pass
(one exception, bounded: ``fused_logprobs`` keeps a small problem's probabilities, at most an
eighth of its memory budget, for the backward instead of recomputing them). CPU and CUDA, pure
torch.
"""

from importlib.metadata import version as _version

from rl_kernels.chunking import DEFAULT_MEMORY_BUDGET, auto_chunk_rows
from rl_kernels.liger import LigerPolicyLossOutput, liger_policy_loss
from rl_kernels.logprobs import fused_logprobs, sum_pi_squared
from rl_kernels.policy import FUSED_OBJECTIVES, FusedPolicyLossOutput, fused_policy_loss

__version__: str = _version("rl-kernels")

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "FUSED_OBJECTIVES",
    "FusedPolicyLossOutput",
    "LigerPolicyLossOutput",
    "__version__",
    "auto_chunk_rows",
    "fused_logprobs",
    "fused_policy_loss",
    "liger_policy_loss",
    "sum_pi_squared",
]
