"""The demo's tiny model: seeded on the CPU generator only, which is restored."""

from __future__ import annotations

import pytest
import torch
from rl_train.tiny import tiny_model, tiny_tokenizer


def test_tiny_model_seeding_leaves_the_caller_random_state_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torch.manual_seed`` would also reseed every CUDA generator (queued until CUDA starts),
    which ``fork_rng(devices=[])`` does not restore."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    before = torch.random.get_rng_state()
    a = tiny_model(len(tiny_tokenizer()), seed=3)
    b = tiny_model(len(tiny_tokenizer()), seed=3)
    assert calls == []
    # bit-exact: the caller's CPU generator is restored exactly
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name  # bit-exact: one seed, the same initialisation
