"""A lean sampling loop for decoder-only transformers models, token for token ``generate``'s.

Hugging Face ``generate`` spends a fixed Python cost per token (its logits-processor and
stopping-criteria lists, model-kwargs bookkeeping, output containers) that is most of a step
for a small model. :func:`lean_decode` runs the same computation without it: one prefill
forward over the (left-padded, ``n``-times repeated) prompts with a ``DynamicCache``, then one
forward per new token, the caller's processing of the float32 last-position logits,
``torch.multinomial(softmax(scores), 1)`` (or ``argmax`` when greedy), finished rows padded,
and a stop once every row has ended or ``max_new_tokens`` are made. The model is called with
exactly the arguments ``generate`` passes it (``input_ids``, ``past_key_values``, the 2-D
integer ``attention_mask`` or None when it is all ones, ``position_ids`` counted along the
mask, ``logits_to_keep=1``, ``use_cache``), and the random stream is consumed the same way
(one ``multinomial`` per step; on CPU the same draw computed vectorised, see
:func:`_cpu_multinomial`), so under the same seed the tokens are bit-identical to
``generate``'s; ``tests/test_decode.py`` checks it against ``generate`` for every option.

:func:`supports_lean_decode` says when that holds: a decoder-only ``PreTrainedModel`` with
the generic ``prepare_inputs_for_generation``, the default dynamic cache and no logits
processing of its own in ``generation_config`` (no ``suppress_tokens``, ``bad_words_ids``,
forced tokens, ...). Anything else (and stop strings, and extra ``generate`` arguments such as
``synced_gpus``) stays with ``generate``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["lean_decode", "supports_lean_decode"]

#: ``(input_ids [R, t], logits [R, V] float32, step) -> scores [R, V]``
Process = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]

# generation_config fields that make ``generate`` add processing or change the loop; each must
# be at its default (None, or the value below) for the lean loop to be exact.
_MUST_BE_UNSET = (
    "bad_words_ids",
    "begin_suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "sequence_bias",
    "exponential_decay_length_penalty",
    "watermarking_config",
    "guidance_scale",
    "max_time",
    "stop_strings",
    "epsilon_cutoff",
    "eta_cutoff",
    "cache_implementation",
    "prefill_chunk_size",
    "assistant_model",
    "prompt_lookup_num_tokens",
)
_MUST_BE = {
    "no_repeat_ngram_size": (None, 0),
    "encoder_repetition_penalty": (None, 1.0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "renormalize_logits": (None, False),
    "remove_invalid_values": (None, False),
    "min_length": (None, 0),
    "diversity_penalty": (None, 0.0),
    "use_cache": (None, True),
}


def supports_lean_decode(model: Any) -> bool:
    """Whether :func:`lean_decode` reproduces ``model.generate`` exactly for this model."""
    try:
        from transformers import GenerationMixin, PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if not isinstance(model, PreTrainedModel) or not isinstance(model, GenerationMixin):
        return False
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    experts = getattr(model, "get_experts_implementation", None)
    gen = getattr(model, "generation_config", None)
    checks = (
        not getattr(model.config, "is_encoder_decoder", False),
        type(model).prepare_inputs_for_generation is GenerationMixin.prepare_inputs_for_generation,
        supports is not None and supports(),
        # generate switches these MoE kernels for decoding on accelerators
        experts is None or "grouped_mm" not in (experts() or {}).values(),
        gen is None or all(getattr(gen, name, None) is None for name in _MUST_BE_UNSET),
        gen is None or all(getattr(gen, name, None) in ok for name, ok in _MUST_BE.items()),
    )
    return all(checks)


def _one(probs: torch.Tensor) -> torch.Tensor:
    """[R] one ``torch.multinomial`` draw per row of [R, V] ``probs``."""
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def _cpu_multinomial(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[R] what ``torch.multinomial(probs, 1)`` draws on CPU, from the same random numbers.

    PyTorch's CPU kernel draws one sample as ``argmax(probs / q)`` with ``q ~ Exp(1)`` from
    ``exponential_``, which computes ``-log1p(-u)`` in float64 from one float64 uniform ``u``
    per element; its serial per-element loop is about half of a decode step's sampling time
    on a small model. This is the same computation, vectorised (float32 ``q`` equal bit for bit:
    checked over millions of draws, and at run time by :func:`cpu_multinomial_is_exact`).
    The kernel's validity check (a host sync per step) is left to :func:`lean_decode`, which
    checks every step's ``probs`` at once after the loop.
    """
    uniform = torch.rand(probs.shape, dtype=torch.float64, generator=generator)
    q = torch.log1p(-uniform).neg_().to(probs.dtype)
    return (probs / q).argmax(dim=-1)


@functools.cache
def cpu_multinomial_is_exact() -> bool:
    """Whether :func:`_cpu_multinomial` is this PyTorch's ``torch.multinomial`` on CPU.

    Draws and generator state are compared once per process, on private generators.
    """
    for seed in range(4):
        logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(seed)) * 3
        probs = torch.softmax(logits, dim=-1)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        if not torch.equal(torch.multinomial(probs, 1, generator=a).squeeze(1),
                           _cpu_multinomial(probs, b)):  # fmt: skip
            return False
        if not torch.equal(a.get_state(), b.get_state()):
            return False
    return True


@torch.no_grad()
def lean_decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    process: Process,
    do_sample: bool,
    eos_token_ids: tuple[int, ...],
    pad_token_id: int,
    record_logprobs: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample up to ``max_new_tokens`` tokens after left-padded prompts, as ``generate`` does.

    Args:
        model: A model for which :func:`supports_lean_decode` holds.
        input_ids: [R, P] left-padded prompt ids (already repeated ``n`` times per prompt).
        attention_mask: [R, P] True/1 on real prompt tokens.
        max_new_tokens: Most tokens to generate.
        process: Turns the float32 next-token logits [R, V] into the scores sampled from,
            given the context [R, t] and the completion step.
        do_sample: ``multinomial`` over ``softmax(scores)``; otherwise ``argmax``.
        eos_token_ids: Tokens that end a row (it is padded with ``pad_token_id`` afterwards).
        pad_token_id: The filler of finished rows.
        record_logprobs: Also return ``log_softmax(scores)`` at each sampled token.

    Returns:
        [R, S] generated tokens (S <= max_new_tokens: the loop stops once all rows ended) and
        [R, S] float32 log-probs of them under the processed distribution, or None.
    """
    import inspect

    from transformers import DynamicCache

    rows = input_ids.shape[0]
    device = input_ids.device
    sample = _cpu_multinomial if device.type == "cpu" and cpu_multinomial_is_exact() else _one
    accepted = inspect.signature(model.forward).parameters
    fixed: dict[str, Any] = {"use_cache": True, "return_dict": True}
    if "logits_to_keep" in accepted:
        fixed["logits_to_keep"] = 1
    fixed["past_key_values"] = DynamicCache(config=model.config.get_text_config(decoder=True))
    full_mask = attention_mask.long()
    positions: torch.Tensor | None = None
    if "position_ids" in accepted:  # from the mask, as generate does (padding at 0)
        positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
    # generate drops an all-ones mask (the causal fast path)
    mask: torch.Tensor | None = None if bool((full_mask == 1).all()) else full_mask
    ones = torch.ones(rows, 1, dtype=torch.long, device=device)
    eos = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    context = input_ids
    invalid = torch.zeros((), dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    extra = {} if positions is None else {"position_ids": positions}
    out = model(input_ids=input_ids, attention_mask=mask, **extra, **fixed)
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        scores = process(context, logits, step)
        if do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            chosen = sample(probs)
            invalid = invalid | (probs < 0).any() | probs.isnan().any()
        else:
            chosen = torch.argmax(scores, dim=-1)
        chosen = chosen * unfinished + pad_token_id * (1 - unfinished)
        if record_logprobs:
            logprobs.append(torch.log_softmax(scores, dim=-1).gather(1, chosen[:, None])[:, 0])
        tokens.append(chosen)
        context = torch.cat([context, chosen[:, None]], dim=-1)
        unfinished = unfinished & ~torch.isin(chosen, eos)
        if step + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        if mask is not None:
            mask = torch.cat([mask, ones], dim=-1)
        if positions is not None:
            positions = positions[:, -1:] + 1
            extra = {"position_ids": positions}
        out = model(input_ids=chosen[:, None], attention_mask=mask, **extra, **fixed)
    if bool(invalid):  # torch.multinomial's own check, once for all steps
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    generated = torch.stack(tokens, dim=1)
    return generated, torch.stack(logprobs, dim=1) if record_logprobs else None
