"""SamplingParams validation and process_logits against a hand-written reference of each step.

The reference re-implements every step in plain Python loops (no HF logits processors):
repetition penalty (HF convention), logit mask, user processor, temperature, top-k, top-p
(nucleus over the current distribution, keeping at least one token) and min-p, in that order.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from rl_rollout import SamplingParams, process_logits
from rl_testing.tolerance import assert_close

NEG_INF = float("-inf")
V = 16
B = 4
# Boundary guard: the reference and the implementation may round differently, so the random
# inputs must not put any token within this margin of a top-p / min-p threshold.
MARGIN = 1e-4


# --------------------------------------------------------------------------- SamplingParams


SPEC_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "max_new_tokens": 64,
    "min_new_tokens": 0,
    "stop": (),
    "stop_token_ids": (),
    "n": 1,
    "seed": None,
    "logit_mask": None,
    "logits_processor": None,
    "return_logprobs": False,
}


def test_defaults() -> None:
    p = SamplingParams()
    assert dataclasses.is_dataclass(p)
    names = {f.name for f in dataclasses.fields(p)}
    assert set(SPEC_DEFAULTS) <= names
    for name, value in SPEC_DEFAULTS.items():
        assert getattr(p, name) == value, name


def test_frozen() -> None:
    p = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": 0},  # an int is a real number
        {"temperature": 2.5},
        {"top_p": 1},
        {"top_p": 1.0},
        {"top_p": 1e-6},
        {"top_k": 0},
        {"top_k": 1},
        {"min_p": 0.0},
        {"min_p": 0.99},
        {"repetition_penalty": 0.5},
        {"repetition_penalty": 1.3},
        {"max_new_tokens": 1},
        {"min_new_tokens": 5, "max_new_tokens": 5},
        {"n": 1},
        {"n": 8},
        {"seed": 0},
        {"stop": ("\n", "xy")},
        {"stop_token_ids": (2, 9)},
        {"logit_mask": torch.ones(V, dtype=torch.bool)},
        {"logits_processor": lambda ids, scores: scores},
        {"return_logprobs": True},
    ],
    ids=lambda kwargs: ",".join(
        f"{k}=<callable>" if callable(v) else f"{k}={v!r}" for k, v in kwargs.items()
    ),  # no object address in a test id: every pytest-xdist worker collects the same ids
)
def test_valid_values_accepted(kwargs: dict[str, Any]) -> None:
    p = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        got = getattr(p, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(got, value)  # bit-exact: stored as given
        elif callable(value):
            assert got is value
        else:
            assert got == value


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("temperature", {"temperature": -0.1}),
        ("temperature", {"temperature": -1.0}),
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": -0.5}),
        ("top_p", {"top_p": 1.01}),
        ("top_k", {"top_k": -1}),
        ("min_p", {"min_p": -0.1}),
        ("min_p", {"min_p": 1.0}),
        ("min_p", {"min_p": 1.5}),
        ("repetition_penalty", {"repetition_penalty": 0.0}),
        ("repetition_penalty", {"repetition_penalty": -1.0}),
        ("max_new_tokens", {"max_new_tokens": 0}),
        ("max_new_tokens", {"max_new_tokens": -3}),
        ("min_new_tokens", {"min_new_tokens": 5, "max_new_tokens": 4}),
        ("min_new_tokens", {"min_new_tokens": 65}),  # default max_new_tokens is 64
        ("min_new_tokens", {"min_new_tokens": -1}),
        ("n", {"n": 0}),
        ("n", {"n": -2}),
        ("logit_mask", {"logit_mask": torch.ones(2, V, dtype=torch.bool)}),
        ("logit_mask", {"logit_mask": torch.ones(V, dtype=torch.float32)}),
        # wrong types: caught here, not as a bare error deep in generation
        ("temperature", {"temperature": float("inf")}),
        ("temperature", {"temperature": float("nan")}),
        ("temperature", {"temperature": "0.7"}),
        ("top_p", {"top_p": None}),
        ("repetition_penalty", {"repetition_penalty": True}),
        ("max_new_tokens", {"max_new_tokens": 2.5}),
        ("max_new_tokens", {"max_new_tokens": 8.0}),
        ("n", {"n": 2.0}),
        ("n", {"n": True}),
        ("top_k", {"top_k": "5"}),
        ("min_new_tokens", {"min_new_tokens": 1.0}),
        ("seed", {"seed": "abc"}),
        ("seed", {"seed": 1.5}),
        ("stop", {"stop": "zzzz"}),
        ("stop", {"stop": ("",)}),
        ("stop", {"stop": ("a", 3)}),
        ("stop_token_ids", {"stop_token_ids": 2}),
        ("stop_token_ids", {"stop_token_ids": (-1,)}),
        ("stop_token_ids", {"stop_token_ids": (2.0,)}),
        ("stop_token_ids", {"stop_token_ids": "2"}),
    ],
    ids=lambda v: v if isinstance(v, str) else repr(v),
)
def test_invalid_values_raise_naming_the_field(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"`{re.escape(field)}`"):
        SamplingParams(**kwargs)


def test_a_stop_string_is_not_split_into_characters() -> None:
    with pytest.raises(ValueError, match=re.escape("e.g. stop=('zzzz',)")):
        SamplingParams(stop="zzzz")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`stop` has an empty string"):
        SamplingParams(stop=("\n", ""))
    with pytest.raises(ValueError, match=r"`stop_token_ids` must be a tuple of token ids.*got 2$"):
        SamplingParams(stop_token_ids=2)  # type: ignore[arg-type]


def test_lists_are_stored_as_tuples() -> None:
    p = SamplingParams(stop=["\n", "xy"], stop_token_ids=[2, 9])  # type: ignore[arg-type]
    assert p.stop == ("\n", "xy")
    assert p.stop_token_ids == (2, 9)


def test_replace_revalidates() -> None:
    p = SamplingParams(max_new_tokens=8, min_new_tokens=2)
    with pytest.raises(ValueError, match=r"\bn\b"):
        dataclasses.replace(p, n=0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        dataclasses.replace(p, max_new_tokens=1)


def test_eval_preset_is_greedy() -> None:
    p = SamplingParams.eval_preset()
    assert isinstance(p, SamplingParams)
    assert p.temperature == 0.0
    assert p.n == 1


def test_eval_preset_overrides() -> None:
    mask = torch.ones(V, dtype=torch.bool)
    p = SamplingParams.eval_preset(
        max_new_tokens=7, stop=("\n",), return_logprobs=True, seed=3, logit_mask=mask
    )
    assert p.temperature == 0.0
    assert p.n == 1
    assert p.max_new_tokens == 7
    assert p.stop == ("\n",)
    assert p.return_logprobs is True
    assert p.seed == 3
    assert p.logit_mask is mask
    # overrides win, even over the greedy fields
    assert SamplingParams.eval_preset(temperature=0.5).temperature == 0.5


def test_eval_preset_validates_overrides() -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams.eval_preset(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.eval_preset(top_p=0.0)


# --------------------------------------------------------------------------- reference steps


def ref_repetition_penalty(
    x: torch.Tensor, input_ids: torch.Tensor, penalty: float
) -> torch.Tensor:
    out = x.clone()
    for b in range(x.shape[0]):
        for t in set(input_ids[b].tolist()):
            v = float(x[b, t])
            out[b, t] = v / penalty if v > 0 else v * penalty
    return out


def ref_logit_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    for i in range(x.shape[1]):
        if not bool(mask[i]):
            out[:, i] = NEG_INF
    return out


def ref_temperature(x: torch.Tensor, t: float) -> torch.Tensor:
    return x.clone() if t in (0.0, 1.0) else x / t


def ref_top_k(x: torch.Tensor, k: int) -> torch.Tensor:
    out = x.clone()
    if k <= 0:
        return out
    for b in range(x.shape[0]):
        row = x[b].tolist()
        order = sorted(range(len(row)), key=lambda i: -row[i])
        for i in order[k:]:
            out[b, i] = NEG_INF
    return out


def _probs(row: list[float]) -> list[float]:
    finite = [v for v in row if v != NEG_INF]
    m = max(finite)
    e = [0.0 if v == NEG_INF else math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def ref_top_p(x: torch.Tensor, p: float, *, check_margin: bool = True) -> torch.Tensor:
    """Keeps the most probable tokens until their mass reaches ``p`` (the token crossing ``p``
    included, so at least one token is always kept)."""
    out = x.clone()
    if p >= 1.0:
        return out
    for b in range(x.shape[0]):
        probs = _probs(x[b].tolist())
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        above = 0.0
        for rank, i in enumerate(order):
            if check_margin and probs[i] > 0:
                assert abs(above - p) > MARGIN, "input too close to the top-p boundary"
            if rank > 0 and above >= p:
                out[b, i] = NEG_INF
            above += probs[i]
    return out


def ref_min_p(x: torch.Tensor, min_p: float, *, check_margin: bool = True) -> torch.Tensor:
    out = x.clone()
    if min_p <= 0.0:
        return out
    for b in range(x.shape[0]):
        probs = _probs(x[b].tolist())
        threshold = min_p * max(probs)
        for i, q in enumerate(probs):
            if check_margin and q > 0:
                assert abs(q - threshold) > MARGIN * threshold, "input too close to min-p"
            if q < threshold:
                out[b, i] = NEG_INF
    return out


def ref_process(
    x: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    repetition_penalty: float = 1.0,
    logit_mask: torch.Tensor | None = None,
    logits_processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> torch.Tensor:
    out = x.clone()
    if repetition_penalty != 1.0:
        out = ref_repetition_penalty(out, input_ids, repetition_penalty)
    if logit_mask is not None:
        out = ref_logit_mask(out, logit_mask)
    if logits_processor is not None:
        out = logits_processor(input_ids, out)
    out = ref_temperature(out, temperature)
    out = ref_top_k(out, top_k)
    out = ref_top_p(out, top_p)
    return ref_min_p(out, min_p)


def random_inputs(
    seed: int, b: int = B, v: int = V, t: int = 6
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=gen) * 2.0
    input_ids = torch.randint(0, v, (b, t), generator=gen)
    input_ids[:, -1] = input_ids[:, 0]  # a repeated token in every row
    return logits, input_ids


def run(logits: torch.Tensor, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """process_logits on a copy (the input is not part of the contract)."""
    out = process_logits(logits.clone(), input_ids.clone(), SamplingParams(**kwargs))
    assert out.shape == logits.shape
    assert out.dtype == logits.dtype
    assert not torch.isnan(out).any()
    assert not torch.isposinf(out).any()
    return out


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same ``-inf`` pattern, close finite values (elementwise ops: one rounding each)."""
    # bit-exact: a bool pattern
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected)), (
        f"filtered sets differ:\n{torch.isneginf(actual)}\n{torch.isneginf(expected)}"
    )
    finite = torch.isfinite(expected)
    scale = float(expected[finite].abs().max()) if finite.any() else 1.0
    assert_close(actual[finite], expected[finite], scale=scale)


# --------------------------------------------------------------------------- process_logits


SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_defaults_are_identity(seed: int) -> None:
    logits, input_ids = random_inputs(seed)
    assert torch.equal(run(logits, input_ids), logits)  # bit-exact: nothing to do, logits as given


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_temperature_is_skipped(seed: int) -> None:
    logits, input_ids = random_inputs(seed)
    # bit-exact: no division, logits as given
    assert torch.equal(run(logits, input_ids, temperature=0.0), logits)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.5])
def test_temperature_divides(temperature: float) -> None:
    logits, input_ids = random_inputs(0)
    assert_same(run(logits, input_ids, temperature=temperature), logits / temperature)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [1.5, 0.8])
def test_repetition_penalty_hf_convention(seed: int, penalty: float) -> None:
    logits, input_ids = random_inputs(seed)
    present = torch.zeros_like(logits, dtype=torch.bool).scatter(1, input_ids, True)
    # guard: the inputs exercise both signs, and some tokens are absent
    assert (logits[present] > 0).any()
    assert (logits[present] < 0).any()
    assert (~present).any()
    expected = ref_repetition_penalty(logits, input_ids, penalty)
    out = run(logits, input_ids, repetition_penalty=penalty)
    assert_same(out, expected)
    assert torch.equal(out[~present], logits[~present])  # bit-exact: untouched entries


def test_repetition_penalty_uses_each_rows_own_tokens() -> None:
    logits = torch.full((2, V), 2.0)
    input_ids = torch.tensor([[3, 3, 4], [5, 6, 7]])
    out = run(logits, input_ids, repetition_penalty=2.0)
    assert out[0].tolist() == [2.0] * 3 + [1.0, 1.0] + [2.0] * (V - 5)
    assert out[1].tolist() == [2.0] * 5 + [1.0, 1.0, 1.0] + [2.0] * (V - 8)


@pytest.mark.parametrize("seed", SEEDS)
def test_logit_mask(seed: int) -> None:
    logits, input_ids = random_inputs(seed)
    mask = torch.rand(V, generator=torch.Generator().manual_seed(seed + 100)) < 0.6
    mask[0] = True
    mask[1] = False
    out = run(logits, input_ids, logit_mask=mask)
    assert_same(out, ref_logit_mask(logits, mask))
    assert torch.isneginf(out[:, ~mask]).all()
    assert torch.equal(out[:, mask], logits[:, mask])  # bit-exact: untouched entries


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k(seed: int, k: int) -> None:
    logits, input_ids = random_inputs(seed)
    out = run(logits, input_ids, top_k=k)
    assert_same(out, ref_top_k(logits, k))
    assert (torch.isfinite(out).sum(1) == k).all()


def test_top_k_at_least_vocab_is_a_no_op() -> None:
    logits, input_ids = random_inputs(0)
    # bit-exact: a no-op returns the logits as given
    assert torch.equal(run(logits, input_ids, top_k=V), logits)
    assert torch.equal(run(logits, input_ids, top_k=V + 10), logits)  # bit-exact: as above


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_top_p(seed: int, p: float) -> None:
    logits, input_ids = random_inputs(seed)
    out = run(logits, input_ids, top_p=p)
    assert_same(out, ref_top_p(logits, p))


@pytest.mark.parametrize("seed", SEEDS)
def test_top_p_keeps_at_least_one_token(seed: int) -> None:
    logits, input_ids = random_inputs(seed)
    out = run(logits, input_ids, top_p=1e-6)
    assert (torch.isfinite(out).sum(1) == 1).all()
    assert torch.equal(out.argmax(1), logits.argmax(1))  # bit-exact: integer indices
    rows = torch.arange(B)
    # bit-exact: the kept entry is untouched
    assert torch.equal(out[rows, logits.argmax(1)], logits.max(1).values)


def test_top_p_peaked_row_keeps_only_the_top_token() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5] = 10.0  # p(5) > 0.99
    out = run(logits, torch.tensor([[0]]), top_p=0.5)
    assert torch.isfinite(out).sum() == 1
    assert out[0, 5] == 10.0


def test_top_p_keeps_the_token_crossing_the_threshold() -> None:
    # probs 0.5, 0.3, 0.2 (+ nothing else): top_p = 0.6 keeps the first two
    logits = torch.full((1, 5), NEG_INF)
    logits[0, :3] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    out = run(logits, torch.tensor([[0]]), top_p=0.6)
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5])
def test_min_p(seed: int, min_p: float) -> None:
    logits, input_ids = random_inputs(seed)
    out = run(logits, input_ids, min_p=min_p)
    assert_same(out, ref_min_p(logits, min_p))
    assert (torch.isfinite(out).sum(1) >= 1).all()


def test_user_processor_sees_masked_scores_and_the_input_ids() -> None:
    logits, input_ids = random_inputs(0)
    mask = torch.ones(V, dtype=torch.bool)
    mask[[2, 9]] = False
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def proc(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen.append((ids.clone(), scores.clone()))
        out = scores.clone()
        out[:, 4] = out[:, 4] + 1.0
        return out

    out = run(logits, input_ids, logit_mask=mask, logits_processor=proc, repetition_penalty=1.2)
    assert len(seen) == 1
    ids_seen, scores_seen = seen[0]
    assert torch.equal(ids_seen, input_ids)  # bit-exact: integer token ids
    # the processor runs after the repetition penalty and the mask
    expected_in = ref_logit_mask(ref_repetition_penalty(logits, input_ids, 1.2), mask)
    assert_same(scores_seen, expected_in)
    expected = expected_in.clone()
    expected[:, 4] += 1.0
    assert_same(out, expected)


def test_user_processor_runs_before_temperature() -> None:
    logits, input_ids = random_inputs(1)

    def proc(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + 1.0

    out = run(logits, input_ids, logits_processor=proc, temperature=0.5)
    assert_same(out, (logits + 1.0) / 0.5)


def test_temperature_applies_before_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    # raw: p0 ~ 0.64 < 0.8 -> two tokens; tempered by 0.5: p0 ~ 0.87 >= 0.8 -> one token
    out = run(logits, torch.tensor([[3]]), temperature=0.5, top_p=0.8)
    assert torch.isfinite(out[0]).tolist() == [True, False, False, False]
    assert out[0, 0].item() == pytest.approx(4.0)


def test_top_k_applies_before_top_p() -> None:
    logits = torch.tensor([[1.0, 0.0, -0.1] + [-0.2] * (V - 3)])
    # after top-k=3: probs .58/.21/.19 -> top-p .7 keeps {0, 1}; top-p first would keep 3 tokens
    out = run(logits, torch.tensor([[0]]), top_k=3, top_p=0.7)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [0, 1]


def test_logit_mask_applies_before_top_k() -> None:
    logits = torch.arange(V, dtype=torch.float32)[None]  # token V-1 is the best
    mask = torch.ones(V, dtype=torch.bool)
    mask[V - 1] = False
    out = run(logits, torch.tensor([[0]]), logit_mask=mask, top_k=2)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [V - 3, V - 2]


def test_repetition_penalty_applies_before_top_k() -> None:
    logits = torch.tensor([[3.0, 2.5, 1.0, 0.0]])
    # penalising token 0 (3.0 -> 0.75) drops it out of the top 2
    out = run(logits, torch.tensor([[0]]), repetition_penalty=4.0, top_k=2)
    assert torch.isfinite(out[0]).tolist() == [False, True, True, False]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.7, "top_k": 8, "top_p": 0.8},
        {"temperature": 1.3, "top_p": 0.9, "min_p": 0.05},
        {"temperature": 0.7, "top_k": 10, "top_p": 0.85, "min_p": 0.1, "repetition_penalty": 1.3},
        {"temperature": 0.0, "top_k": 5, "repetition_penalty": 1.2},
    ],
    ids=repr,
)
def test_full_pipeline_matches_reference(seed: int, kwargs: dict[str, Any]) -> None:
    logits, input_ids = random_inputs(seed)
    mask = torch.ones(V, dtype=torch.bool)
    mask[[1, 6]] = False

    def proc(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        out[:, 3] = out[:, 3] + 0.5
        return out

    expected = ref_process(logits, input_ids, logit_mask=mask, logits_processor=proc, **kwargs)
    out = run(logits, input_ids, logit_mask=mask, logits_processor=proc, **kwargs)
    assert_same(out, expected)
    assert (torch.isfinite(out).sum(1) >= 1).all()


def test_batch_rows_are_independent() -> None:
    logits, input_ids = random_inputs(2)
    kwargs: dict[str, Any] = {
        "temperature": 0.8,
        "top_k": 9,
        "top_p": 0.85,
        "min_p": 0.05,
        "repetition_penalty": 1.4,
    }
    full = run(logits, input_ids, **kwargs)
    for b in range(B):
        single = run(logits[b : b + 1], input_ids[b : b + 1], **kwargs)
        assert_same(single, full[b : b + 1])
