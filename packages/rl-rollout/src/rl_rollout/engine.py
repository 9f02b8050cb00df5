"""Generation engines behind one interface, and the Hugging Face ``generate`` engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rl_rollout.params import SamplingParams, process_logits
from rl_rollout.result import RolloutResult

__all__ = ["Engine", "HFEngine", "available_engines", "get_engine", "register_engine"]

Prompts = Sequence[str] | Sequence[Sequence[int]]


class Engine(Protocol):
    """What rl-algos needs from a generation engine."""

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` completions per prompt."""
        ...


_ENGINES: dict[str, Callable[..., Engine]] = {}


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    """Register an engine factory under ``name`` (decorator); duplicates raise ``ValueError``."""

    def decorator(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        if name in _ENGINES:
            raise ValueError(f"an engine named {name!r} is registered already")
        _ENGINES[name] = factory
        return factory

    return decorator


def get_engine(name: str) -> Callable[..., Engine]:
    """The engine factory registered under ``name`` (KeyError lists the known ones)."""
    try:
        return _ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(_ENGINES))}") from None


def available_engines() -> list[str]:
    """Registered engine names."""
    return sorted(_ENGINES)


class _Processor(LogitsProcessor):
    """Applies :func:`process_logits` each step and records the sampled tokens' log-probs."""

    def __init__(
        self, params: SamplingParams, prompt_mask: torch.Tensor, eos: tuple[int, ...], record: bool
    ) -> None:
        self.params = params
        self.prompt_mask = prompt_mask  # [rows, P] bool
        self.eos = eos
        self.record = record
        self.previous: torch.Tensor | None = None  # [rows, V] processed log-softmax
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        width = self.prompt_mask.shape[1]
        step = input_ids.shape[1] - width
        if self.record and self.previous is not None:
            self.logprobs.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        generated = torch.ones(input_ids.shape[0], step, dtype=torch.bool, device=input_ids.device)
        mask = torch.cat([self.prompt_mask, generated], dim=1)
        processed = process_logits(
            scores, input_ids, self.params, input_mask=mask, step=step, eos_token_ids=self.eos
        )
        if self.record:
            self.previous = torch.log_softmax(processed.float(), dim=-1)
        return processed

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, steps] recorded log-probs, the last step's gathered from ``last_tokens``."""
        if self.previous is not None:
            self.logprobs.append(self.previous.gather(1, last_tokens[:, None]).squeeze(1))
        return torch.stack(self.logprobs, dim=1)


def _first_stop(
    tokens: list[int], stop_ids: set[int], stop: tuple[str, ...], decode: Callable[[list[int]], str]
) -> int | None:
    """Index of the token that ends the completion (EOS/stop id, or completes a stop string)."""
    end = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
    if stop:
        limit = len(tokens) if end is None else end
        for i in range(limit):
            text = decode(tokens[: i + 1])
            if any(s in text for s in stop):
                return i
    return end


@register_engine("hf")
class HFEngine:
    """Batched generation with Hugging Face ``generate``.

    Prompts are left-padded and split into chunks (``prompts_per_batch`` prompts, or as many
    as fit ``token_budget`` tokens counting ``(prompt_len + max_new_tokens) * n`` each); each
    chunk is one ``generate`` call with ``num_return_sequences = n``. All sampling processing
    (repetition penalty, min_new_tokens, logit mask, hook, temperature, top-k, top-p, min-p) is
    :func:`rl_rollout.process_logits`, passed to ``generate`` as a logits processor with HF's
    own warpers switched off, so the recorded log-probs are those of the distribution actually
    sampled from, and a trainer can recompute them exactly.

    Args:
        model: A transformers causal LM (or anything with ``generate`` and ``config``).
        tokenizer: Its tokenizer (pad and eos ids are read from it).
        max_model_len: Longest prompt + completion; default ``max_position_embeddings``.
        prompts_per_batch: Prompts per ``generate`` call (None: all, or by ``token_budget``).
        token_budget: Tokens per ``generate`` call, counting ``(prompt + max_new) * n``.
        truncation: ``"error"`` for prompts longer than ``max_model_len - max_new_tokens``
            (the default), or ``"left"`` to keep their last tokens.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_model_len: int | None = None,
        prompts_per_batch: int | None = None,
        token_budget: int | None = None,
        truncation: Literal["error", "left"] = "error",
    ) -> None:
        if truncation not in ("error", "left"):
            raise ValueError(f"`truncation` must be 'error' or 'left', got {truncation!r}")
        if prompts_per_batch is not None and prompts_per_batch < 1:
            raise ValueError(f"`prompts_per_batch` must be >= 1, got {prompts_per_batch}")
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"`token_budget` must be >= 1, got {token_budget}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or int(model.config.max_position_embeddings)
        self.prompts_per_batch = prompts_per_batch
        self.token_budget = token_budget
        self.truncation = truncation
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token")
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)

    # -- inputs ------------------------------------------------------------------------------

    def _encode(self, prompts: Prompts, params: SamplingParams) -> list[list[int]]:
        if len(prompts) == 0:
            raise ValueError("`prompts` is empty: pass at least one prompt")
        limit = self.max_model_len - params.max_new_tokens
        if limit < 1:
            raise ValueError(
                f"`max_new_tokens` = {params.max_new_tokens} leaves no room for a prompt within "
                f"max_model_len = {self.max_model_len}"
            )
        encoded: list[list[int]] = []
        for i, prompt in enumerate(prompts):
            ids = (
                list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
                if isinstance(prompt, str)
                else [int(t) for t in cast(Sequence[int], prompt)]
            )
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) > limit:
                if self.truncation == "error":
                    raise ValueError(
                        f"prompt {i} has {len(ids)} tokens, more than max_model_len - "
                        f"max_new_tokens = {self.max_model_len} - {params.max_new_tokens} = "
                        f"{limit}; shorten it or use truncation='left'"
                    )
                ids = ids[-limit:]
            encoded.append(ids)
        return encoded

    def _chunks(self, encoded: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Indices of the prompts of each ``generate`` call."""
        if self.prompts_per_batch is None and self.token_budget is None:
            return [list(range(len(encoded)))]
        chunks: list[list[int]] = [[]]
        used = 0
        for i, ids in enumerate(encoded):
            cost = (len(ids) + params.max_new_tokens) * params.n
            full = self.prompts_per_batch is not None and len(chunks[-1]) >= self.prompts_per_batch
            over = self.token_budget is not None and used + cost > self.token_budget
            if chunks[-1] and (full or over):
                chunks.append([])
                used = 0
            chunks[-1].append(i)
            used += cost
        return chunks

    # -- generation --------------------------------------------------------------------------

    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.bool)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = True
        ids, mask = ids.to(device), mask.to(device)
        eos = (self.eos_id, *params.stop_token_ids)
        processor = _Processor(
            params, mask.repeat_interleave(params.n, dim=0), (self.eos_id,), params.return_logprobs
        )
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": mask.long(),
            "max_new_tokens": params.max_new_tokens,
            "do_sample": not params.greedy,
            "num_return_sequences": params.n,
            "logits_processor": LogitsProcessorList([processor]),
            "eos_token_id": list(eos),
            "pad_token_id": self.pad_id,
            # every warper off: the processor above is the whole processing
            "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": None, "typical_p": 1.0,
            "repetition_penalty": 1.0, "min_new_tokens": 0, "num_beams": 1,
        }  # fmt: skip
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            with torch.no_grad():
                out = self.model.generate(**kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        completion = sequences[:, width:]
        logprobs = processor.finish(completion[:, -1]) if params.return_logprobs else None
        return (
            ids.repeat_interleave(params.n, 0),
            mask.repeat_interleave(params.n, 0),
            completion,
            logprobs,
        )

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` completions for each prompt; see :class:`RolloutResult`."""
        encoded = self._encode(prompts, params)
        parts = [
            self._generate_chunk([encoded[i] for i in c], params)
            for c in self._chunks(encoded, params)
        ]
        p_width = max(p[0].shape[1] for p in parts)
        c_width = max(p[2].shape[1] for p in parts)
        prompt_ids, prompt_mask, completions, logprobs = [], [], [], []
        for pid, pmask, comp, lp in parts:
            pad_p = p_width - pid.shape[1]
            pad_c = c_width - comp.shape[1]
            prompt_ids.append(torch.nn.functional.pad(pid, (pad_p, 0), value=self.pad_id))
            prompt_mask.append(torch.nn.functional.pad(pmask, (pad_p, 0), value=False))
            completions.append(torch.nn.functional.pad(comp, (0, pad_c), value=self.pad_id))
            if lp is not None:
                logprobs.append(torch.nn.functional.pad(lp, (0, pad_c), value=0.0))
        completion_ids = torch.cat(completions)
        stop_ids = {self.eos_id, *params.stop_token_ids}
        mask = torch.zeros_like(completion_ids, dtype=torch.bool)
        reasons: list[str] = []
        texts: list[str] = []

        def decode(tokens: list[int]) -> str:
            return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

        for row, tokens in enumerate(completion_ids.tolist()):
            end = _first_stop(
                tokens[: self._generated_length(row, parts)], stop_ids, params.stop, decode
            )
            length = self._generated_length(row, parts) if end is None else end + 1
            mask[row, :length] = True
            reasons.append("length" if end is None else "stop")
            text = decode(tokens[:length])
            cut = min((text.find(s) for s in params.stop if s in text), default=-1)
            texts.append(text[:cut] if cut >= 0 else text)
        lp_all = None
        if logprobs:
            lp_all = torch.where(
                mask, torch.cat(logprobs), torch.zeros((), dtype=logprobs[0].dtype)
            )
        n_rows = completion_ids.shape[0]
        return RolloutResult(
            prompt_ids=torch.cat(prompt_ids),
            prompt_mask=torch.cat(prompt_mask),
            completion_ids=completion_ids,
            completion_mask=mask,
            finish_reasons=reasons,
            group_index=torch.arange(n_rows) // params.n,
            texts=texts,
            logprobs=lp_all,
        )

    @staticmethod
    def _generated_length(row: int, parts: list[Any]) -> int:
        """Tokens ``generate`` produced for the chunk holding ``row``."""
        seen = 0
        for _, _, comp, _ in parts:
            if row < seen + comp.shape[0]:
                return int(comp.shape[1])
            seen += comp.shape[0]
        return 0  # pragma: no cover - rows are always within the parts
