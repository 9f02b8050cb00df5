"""The critic's value head: a linear map from the last hidden state to a scalar."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ValueHead"]


class ValueHead(nn.Module):
    """``V(s) = w^T h + b``: hidden states [..., H] to values [...].

    Args:
        hidden_size: H, the model's hidden size.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"`hidden_size` must be >= 1, got {hidden_size}")
        self.linear = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values for hidden states [..., H] -> [...]."""
        out: torch.Tensor = self.linear(hidden.to(self.linear.weight.dtype))
        return out.squeeze(-1)
