"""Seeded initialisation seeds only the generators it restores (``rl_adapters.seeding``).

``torch.manual_seed`` inside ``fork_rng(devices=[])`` would reseed every CUDA generator (queued
until CUDA starts, on a machine without one) while only the CPU generator is restored. A spy
on ``torch.cuda.manual_seed_all`` sees any such call, with or without a GPU.
"""

from __future__ import annotations

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import ILQLHeads, ILQLHeadsConfig, PolicyModel, SharedBasePopulation
from rl_adapters.seeding import seeded


@pytest.fixture
def cuda_seeds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seeds anything passed to ``torch.cuda.manual_seed_all`` during the test."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", calls.append)
    return calls


def test_seeded_restores_the_cpu_generator_and_repeats() -> None:
    before = torch.random.get_rng_state()
    with seeded(7):
        a = torch.rand(3)
    with seeded(7):
        b = torch.rand(3)
    # bit-exact: the same generator state draws the same numbers; the state is restored
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), before)


def test_builders_leave_the_cuda_generators_alone(cuda_seeds: list[int]) -> None:
    before = torch.random.get_rng_state()
    policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), critic=True, seed=3)
    SharedBasePopulation(tl.base("qwen2"), size=2, lora_config=tl.lora(), seed=3)
    ILQLHeads(ILQLHeadsConfig(hidden_size=8, vocab_size=5), seed=3)
    assert cuda_seeds == []
    assert policy.value_head is not None
    # bit-exact: the caller's CPU generator is restored exactly
    assert torch.equal(torch.random.get_rng_state(), before)
