"""Generation engines behind one interface, and the Hugging Face ``generate`` engine."""

from __future__ import annotations

import contextlib
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rl_rollout._prompts import Prompts, encode_prompts
from rl_rollout.cancel import raise_if_cancelled
from rl_rollout.decode import lean_decode, supports_lean_decode
from rl_rollout.lora_sync import LoraAdapter, merged_weights
from rl_rollout.params import SamplingParams, process_logits
from rl_rollout.result import RolloutResult, assemble_result
from rl_rollout.routes import RouteRecorder, router_modules

__all__ = [
    "Engine",
    "HFEngine",
    "available_engines",
    "copy_named_tensors",
    "encode_prompts",
    "get_engine",
    "register_engine",
]


class Engine(Protocol):
    """What rl-algos needs from a generation engine.

    ``generate`` samples; the other five keep the engine's weights equal to the trainer's and
    share the accelerator with it. Engines that generate with the trainer's own model object
    (:class:`HFEngine`) make them no-ops.
    """

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` completions per prompt."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Full-weight sync: overwrite the engine's tensors with these (Hugging Face names)."""
        ...

    def load_lora(self, name: str, path: str) -> None:
        """LoRA sync: (re)load the peft adapter saved at ``path`` and generate with it."""
        ...

    def load_adapter(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        version: int,
    ) -> None:
        """Adapter-only sync in memory: generate with this LoRA adapter from now on.

        ``tensors`` are in peft's saved form (``base_model.model.<module>.lora_A.weight``
        [r, in], ``...lora_B.weight`` [out, r]), ``config`` is peft's ``LoraConfig`` as a dict,
        ``version`` the policy version; every later result carries it as
        :attr:`RolloutResult.weight_version`. The load is whole or refused (``ValueError``
        naming the adapter): nothing is sampled from a half-loaded adapter.
        """
        ...

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for training (1: offload weights, 2: discard them)."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Take the memory back before generating (``tags``: "weights", "kv_cache")."""
        ...


def copy_named_tensors(
    model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> list[str]:
    """Copy tensors into ``model``'s parameters/buffers by name; returns the names copied.

    Raises:
        KeyError: a name the model does not have (the message lists a few it does have).
        ValueError: a shape that differs from the model's tensor.
    """
    targets: dict[str, torch.Tensor] = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    copied: list[str] = []
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in targets:
                known = ", ".join(list(targets)[:5])
                raise KeyError(
                    f"`named_tensors` has {name!r}, which the model lacks (it has {known}, ...)"
                )
            target = targets[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"`named_tensors`[{name!r}] has shape {tuple(tensor.shape)}, the model's is "
                    f"{tuple(target.shape)}"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            copied.append(name)
    return copied


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
        step = input_ids.shape[1] - self.prompt_mask.shape[1]
        if self.record and self.previous is not None:
            self.logprobs.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        processed = self.process(input_ids, scores, step)
        if self.record:
            self.previous = torch.log_softmax(processed.float(), dim=-1)
        return processed

    def process(self, input_ids: torch.Tensor, scores: torch.Tensor, step: int) -> torch.Tensor:
        """:func:`process_logits` of [rows, V] ``scores`` after context [rows, t] at ``step``.

        Raises:
            GenerationCancelledError: the caller left (:mod:`rl_rollout.cancel`): before a token
                is sampled, in the lean loop and in ``generate`` alike.
        """
        raise_if_cancelled()
        mask = None  # only the repetition penalty reads which context tokens are padding
        if self.params.repetition_penalty != 1.0:
            generated = torch.ones(
                input_ids.shape[0], step, dtype=torch.bool, device=input_ids.device
            )
            mask = torch.cat([self.prompt_mask, generated], dim=1)
        return process_logits(
            scores, input_ids, self.params, input_mask=mask, step=step, eos_token_ids=self.eos
        )

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, steps] recorded log-probs, the last step's gathered from ``last_tokens``."""
        if self.previous is not None:
            self.logprobs.append(self.previous.gather(1, last_tokens[:, None]).squeeze(1))
        return torch.stack(self.logprobs, dim=1)


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
        max_model_len: Longest prompt + completion (>= 1); default ``max_position_embeddings``.
            With a larger value, the first generation whose prompt plus ``max_new_tokens``
            goes past the positions warns (only a rope-scaled model is right there).
        prompts_per_batch: Prompts per ``generate`` call (None: all, or by ``token_budget``).
        token_budget: Tokens per ``generate`` call, counting ``(prompt + max_new) * n``.
        truncation: ``"error"`` for prompts longer than ``max_model_len - max_new_tokens``
            (the default), or ``"left"`` to keep their last tokens.
        generate_kwargs: Further ``generate`` arguments, e.g. ``{"synced_gpus": True}`` for a
            model partitioned by DeepSpeed ZeRO-3 (every process must call ``generate``
            the same number of times). Sampling arguments are refused: use
            :class:`SamplingParams`.
        record_routes: Record the experts a mixture-of-experts model routes each token to
            (:class:`rl_rollout.routes.RouteRecorder`): :attr:`RolloutResult.routes`. Refused
            for a dense model.
        decode: ``"lean"`` (the default) samples with :func:`rl_rollout.decode.lean_decode`,
            token for token what ``generate`` gives under the same seed without its per-token
            Python cost, wherever that is exact: a decoder-only model that
            :func:`~rl_rollout.decode.supports_lean_decode`, no ``stop`` strings and no
            ``generate_kwargs``; otherwise, and with ``"generate"``, ``model.generate``.
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
        generate_kwargs: dict[str, Any] | None = None,
        decode: Literal["lean", "generate"] = "lean",
        record_routes: bool = False,
    ) -> None:
        if decode not in ("lean", "generate"):
            raise ValueError(f"`decode` must be 'lean' or 'generate', got {decode!r}")
        if truncation not in ("error", "left"):
            raise ValueError(f"`truncation` must be 'error' or 'left', got {truncation!r}")
        if prompts_per_batch is not None and prompts_per_batch < 1:
            raise ValueError(f"`prompts_per_batch` must be >= 1, got {prompts_per_batch}")
        if token_budget is not None and token_budget < 1:
            raise ValueError(f"`token_budget` must be >= 1, got {token_budget}")
        positions = getattr(model.config, "max_position_embeddings", None)
        if max_model_len is None:
            max_model_len = int(model.config.max_position_embeddings)
        elif isinstance(max_model_len, bool) or not isinstance(max_model_len, numbers.Integral):
            raise ValueError(f"`max_model_len` must be an int or None, got {max_model_len!r}")
        elif max_model_len < 1:
            raise ValueError(
                f"`max_model_len` must be >= 1 (prompt + completion tokens), got "
                f"{max_model_len}; pass None for the model's max_position_embeddings"
            )
        #: the model's positions, when ``max_model_len`` lets sequences go past them (warned
        #: once, at the first generation that does)
        self._positions = (
            int(positions) if positions is not None and max_model_len > positions else None
        )
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = int(max_model_len)
        self.prompts_per_batch = prompts_per_batch
        self.token_budget = token_budget
        self.truncation = truncation
        self.generate_kwargs = dict(generate_kwargs or {})
        self.decode = decode
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token")
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.record_routes = bool(record_routes)
        if self.record_routes and not router_modules(model):
            raise ValueError(
                f"record_routes=True: {type(model).__name__} is not a mixture-of-experts model "
                "(it declares no router), so it has no routes to record"
            )
        self.adapter: str | None = None
        self.weight_version: int | None = None
        self._base_weights: dict[str, torch.nn.Parameter] = {}

    # -- inputs ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int | None:
        """Rows of the model's input embedding: the ids it accepts (``len(tokenizer)`` may differ).

        ``config.vocab_size`` for a model without an input embedding, else None.
        """
        get = getattr(self.model, "get_input_embeddings", None)
        size = getattr(get() if callable(get) else None, "num_embeddings", None)
        if size is None:
            size = getattr(self.model.config, "vocab_size", None)
        return None if size is None else int(size)

    def _encode(self, prompts: Prompts, params: SamplingParams) -> list[list[int]]:
        return encode_prompts(
            prompts,
            self.tokenizer,
            self.max_model_len,
            params.max_new_tokens,
            self.truncation,
            vocab_size=self.vocab_size,
        )

    def _check_params(self, params: SamplingParams) -> None:
        """The vocabulary-sized parts of ``params`` against the model's vocabulary."""
        vocab = self.vocab_size
        if vocab is None:
            return
        if params.logit_mask is not None and params.logit_mask.numel() != vocab:
            raise ValueError(
                f"`logit_mask` has {params.logit_mask.numel()} entries, the model's vocabulary "
                f"has {vocab}: pass a [{vocab}] bool tensor"
            )
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:
            raise ValueError(
                f"`stop_token_ids` has {bad[0]}, outside the model's vocabulary [0, {vocab})"
            )

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
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """[rows, steps] generated tokens, (optionally) their sampling log-probs, and (with
        :attr:`record_routes`) the routes [rows, width + steps, Y, k] of the left-padded
        prompts (width) and the generated tokens (-1 where none ran: padding, the last token),
        on CPU.
        """  # noqa: D205
        recorder = None
        if self.record_routes:
            config = self.model.config
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            recorder = RouteRecorder(self.model, int(text.num_experts_per_tok))
        with recorder if recorder is not None else contextlib.nullcontext():
            completion, logprobs, mask = self._sample_chunk(prompts, params)
        if recorder is None:
            return completion, logprobs, None
        rows, steps = completion.shape
        fed = recorder.routes(rows).cpu()  # [rows, width + steps - 1 (or fewer), Y, k]
        routes = torch.full((rows, mask.shape[1] + steps, *fed.shape[2:]), -1, dtype=fed.dtype)
        routes[:, : fed.shape[1]] = fed
        routes[:, : mask.shape[1]][~mask.cpu()] = -1  # the prompts' left padding
        return completion, logprobs, routes

    def _sample_chunk(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`_generate_chunk`'s tokens and log-probs, and the [rows, width] prompt mask."""
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
        clash = sorted(set(self.generate_kwargs) & set(kwargs))
        if clash:
            raise ValueError(
                f"`generate_kwargs` sets {clash}, which the engine controls: put sampling "
                "settings in SamplingParams"
            )
        if params.greedy:  # warpers are unused; a non-default top_k would only warn
            del kwargs["top_k"]
        kwargs.update(self.generate_kwargs)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        devices = [device] if device.type == "cuda" else []
        lean = self.uses_lean_decode(params)
        with torch.random.fork_rng(devices=devices):
            if params.seed is not None:  # only the generators fork_rng restores
                torch.default_generator.manual_seed(params.seed)
                if devices:
                    index = torch.cuda.current_device() if device.index is None else device.index
                    torch.cuda.default_generators[index].manual_seed(params.seed)
            if lean:
                completion, logprobs = lean_decode(
                    self.model,
                    ids.repeat_interleave(params.n, dim=0),
                    mask.repeat_interleave(params.n, dim=0),
                    max_new_tokens=params.max_new_tokens,
                    process=processor.process,
                    do_sample=not params.greedy,
                    eos_token_ids=eos,
                    pad_token_id=self.pad_id,
                    record_logprobs=params.return_logprobs,
                )
                rows_mask = mask.repeat_interleave(params.n, dim=0)
                return completion.cpu(), None if logprobs is None else logprobs.cpu(), rows_mask
            with torch.no_grad():
                out = self.model.generate(**kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        completion = sequences[:, width:]
        logprobs = processor.finish(completion[:, -1]) if params.return_logprobs else None
        rows_mask = mask.repeat_interleave(params.n, dim=0)
        return completion.cpu(), None if logprobs is None else logprobs.cpu(), rows_mask

    def uses_lean_decode(self, params: SamplingParams) -> bool:
        """Whether ``params`` are sampled with the lean loop (see ``decode``) or ``generate``."""
        return (
            self.decode == "lean"
            and not params.stop
            and not self.generate_kwargs
            and supports_lean_decode(self.model)
        )

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` completions for each prompt; see :class:`RolloutResult`.

        Raises:
            ValueError: bad prompts (see :func:`encode_prompts`), or a ``logit_mask`` or
                ``stop_token_ids`` that does not fit the model's vocabulary.
        """
        self._check_params(params)
        encoded = self._encode(prompts, params)
        self._warn_past_positions(encoded, params)
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        routes: list[tuple[int, torch.Tensor]] = []
        # chunks are contiguous runs of prompts, so the rows stay prompt-major
        for chunk in self._chunks(encoded, params):
            prompts_c = [encoded[i] for i in chunk]
            tokens, lp, chunk_routes = self._generate_chunk(prompts_c, params)
            completions.extend(tokens.tolist())
            if lp is not None:
                logprobs.extend(lp.tolist())
            if chunk_routes is not None:
                routes.append((max(len(p) for p in prompts_c), chunk_routes))
        result = assemble_result(
            encoded,
            completions,
            params.n,
            pad_id=self.pad_id,
            stop_ids={self.eos_id, *params.stop_token_ids},
            stop=params.stop,
            decode=self._decode,
            logprobs=logprobs if params.return_logprobs else None,
        )
        result.weight_version = self.weight_version
        if routes:
            result.routes = _laid_out_routes(routes, result)
        return result

    def _warn_past_positions(self, encoded: list[list[int]], params: SamplingParams) -> None:
        """Warn (once) when a prompt plus ``max_new_tokens`` goes past the model's positions."""
        if self._positions is None:
            return
        longest = max(len(ids) for ids in encoded) + params.max_new_tokens
        if longest > self._positions:
            warnings.warn(
                f"a prompt plus max_new_tokens reaches {longest} tokens, more than the model's "
                f"max_position_embeddings = {self._positions} (`max_model_len` = "
                f"{self.max_model_len}): past the positions it was trained on only a "
                f"rope-scaled model is right; pass max_model_len <= {self._positions} otherwise",
                stacklevel=3,
            )
            self._positions = None

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    # -- weight sync (the trainer's model is this engine's model: nothing to copy) -------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the model's parameters and buffers by name (strict names).

        A loaded adapter (:meth:`load_adapter`) is dropped first: the tensors are base weights.
        """
        self._swap_in({})
        self.adapter = self.weight_version = None
        copy_named_tensors(self.model, named_tensors)

    def load_adapter(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        version: int,
    ) -> None:
        """Generate with the LoRA adapter merged into the targeted linear weights.

        Each becomes ``W + s * B @ A`` (:func:`rl_rollout.lora_sync.merged_weights`, peft's
        order of operations, so a trainer sampling with its merged adapter gets the same bits).

        The merged weights are computed and checked in full before any is swapped in, and from
        the original ``W`` (kept aside), so each version replaces the previous one. The model
        must be a plain transformers model (not peft's, whose adapters are the trainer's).

        Raises:
            ValueError: an adapter that does not fit the model (unknown target module, wrong
                rank), naming the adapter and version.
        """
        adapter = LoraAdapter(name, int(version), dict(config), dict(tensors))
        merged = merged_weights(
            self.model, adapter, lambda n, layer: self._base_weights.get(n, layer.weight)
        )
        self._swap_in(merged)
        self.adapter, self.weight_version = name, int(version)

    def _swap_in(self, merged: dict[str, torch.Tensor]) -> None:
        """Put ``merged`` weights in place; every other swapped module gets its original back."""
        modules = dict(self.model.named_modules())
        for name, original in self._base_weights.items():
            if name not in merged:
                modules[name].weight = original
        for name, weight in merged.items():
            self._base_weights.setdefault(name, modules[name].weight)
            modules[name].weight = torch.nn.Parameter(weight, requires_grad=False)
        self._base_weights = {n: w for n, w in self._base_weights.items() if n in merged}

    def load_lora(self, name: str, path: str) -> None:
        """Not needed: the engine generates with the trainer's own (peft) model."""
        raise NotImplementedError(
            "HFEngine generates with the trainer's model object, whose adapters are already "
            f"current; load_lora({name!r}, ...) is for VLLMEngine and RemoteEngine"
        )

    def sleep(self, level: int = 1) -> None:
        """No-op: the model is the trainer's."""

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """No-op: the model is the trainer's."""


def _laid_out_routes(chunks: list[tuple[int, torch.Tensor]], result: RolloutResult) -> torch.Tensor:
    """[N, P + C, Y, k]: each chunk's routes (``(width_c, [rows, width_c + steps_c, Y, k])``,
    its prompts left-padded to ``width_c``) aligned with ``result.sequences`` (prompts
    left-padded to ``P``, completions right-padded to ``C``), -1 where none was recorded.
    """  # noqa: D205
    P, C = result.prompt_ids.shape[1], result.completion_ids.shape[1]
    N = result.completion_ids.shape[0]
    first = chunks[0][1]
    out = torch.full((N, P + C, *first.shape[2:]), -1, dtype=first.dtype)
    row = 0
    for width, chunk in chunks:
        rows, steps = chunk.shape[0], chunk.shape[1] - width
        out[row : row + rows, P - width : P] = chunk[:, :width]
        out[row : row + rows, P : P + steps] = chunk[:, width:]
        row += rows
    return out
