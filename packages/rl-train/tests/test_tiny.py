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


def test_the_lora_base_differs_only_in_its_final_norm_whose_weight_caps_the_head() -> None:
    """``TINY_LORA_NORM_WEIGHT``'s reason: with the initialisation's norm weight 1 no hidden
    state gives any token more than about 7% (the head cannot be confident, and LoRA cannot move
    it); the LoRA base's norm weight lets one token take most of the probability."""
    from rl_train.tiny import TINY_LORA_NORM_WEIGHT

    vocab = len(tiny_tokenizer())
    plain, lora_base = tiny_model(vocab), tiny_model(vocab, norm_weight=TINY_LORA_NORM_WEIGHT)
    for (name, p), q in zip(plain.named_parameters(), lora_base.parameters(), strict=True):
        if name != "model.norm.weight":
            assert torch.equal(p, q), name  # bit-exact: the same seeded initialisation
    assert torch.equal(lora_base.model.norm.weight, torch.full((64,), TINY_LORA_NORM_WEIGHT))

    def best_probability(model: torch.nn.Module, token: int) -> float:
        """The largest probability of ``token`` over final hidden states (Adam, 300 steps)."""
        hidden = torch.randn(64, generator=torch.Generator().manual_seed(0), requires_grad=True)
        opt = torch.optim.Adam([hidden], lr=0.1)
        for _ in range(300):
            logp = model.lm_head(model.model.norm(hidden)).log_softmax(-1)[token]
            opt.zero_grad()
            (-logp).backward()
            opt.step()
        return float(logp.exp())

    eos = 2
    assert best_probability(plain, eos) < 0.08  # hand-measured: 0.072
    assert best_probability(lora_base, eos) > 0.9  # hand-measured: 0.951
