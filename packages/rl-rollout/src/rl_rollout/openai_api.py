"""The OpenAI-compatible routes of the rollout server (framework-free request handling).

:class:`OpenAIRoutes` turns a request body into prompt token ids and
:class:`~rl_rollout.SamplingParams`, samples with any :class:`~rl_rollout.Engine`, and answers in
the OpenAI format, with the token ids and sampling log-probs of what was sampled:

- ``GET /v1/models``: the one served model (``GET /v1/models/{id}``: its card).
- ``POST /v1/chat/completions``: ``messages`` (and ``tools``) rendered by the tokenizer's chat
  template (``add_generation_prompt``, ``continue_final_message`` and ``chat_template_kwargs``
  as in vLLM); ``logprobs`` / ``top_logprobs=0``, ``n``, ``stop``, ``seed``, ``max_tokens``,
  ``stream`` (:mod:`rl_rollout.openai_stream`: sent after sampling, as server-sent events).
- ``POST /v1/completions``: ``prompt`` as text(s) (tokenised without special tokens, as
  :meth:`Engine.generate` does) or token ids; ``logprobs`` 0 or 1; ``stream``.
- ``POST /inference/v1/generate``: the token route of vLLM and verifiers' ``TrainClient``:
  ``{model, token_ids, sampling_params{max_tokens, temperature, ..., logprobs}}`` ->
  ``choices[i].token_ids``, ``choices[i].logprobs.content[j].logprob``, ``finish_reason``.

Every choice also carries ``token_ids`` and the response ``prompt_token_ids`` (vLLM's
``return_token_ids`` fields), always. The log-probs are those of the processed distribution
that was sampled from (after temperature, top-k, top-p, min-p), the ones a trainer's rollout
correction needs; alternatives (``top_logprobs > 0``) are not computed. The vLLM extensions
``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``stop_token_ids`` and
``allowed_token_ids`` are accepted in the request body; any other field is refused by name
(bookkeeping such as ``user`` or ``metadata`` aside), never ignored, and so are ``tool_choice``
values that would need constrained decoding (``"required"``, a named tool). With a ``tool_parser``
(:mod:`rl_rollout.openai_tools`), a chat reply to a request with ``tools`` carries the calls it
makes as ``message.tool_calls``. When the request names an episode
(header ``X-Episode-Id``, or the body's ``user``), the call is recorded in ``traces`` (see
:mod:`rl_rollout.openai_trace`).

Bad input raises :class:`OpenAIError` (HTTP 400, or 404 for an unknown model), whose JSON body
is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with ``param`` naming the field.

:class:`~rl_rollout.RolloutServer` serves these routes with the standard library's threading
HTTP server, next to its own: the engine samples one request at a time behind the server's
lock, so an asynchronous framework (FastAPI/uvicorn) would add dependencies to every install
without adding throughput. :meth:`OpenAIRoutes.handle` takes ``(path, body, headers)`` and
returns JSON, so mounting it in such a framework is a few lines.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_rollout._openai_checks import (
    REVERSE_FIELDS,
    SAMPLING_FIELDS,
    OpenAIError,
    chat_messages,
    chat_tools,
    check,
    check_fields,
    check_sampling_params,
    check_unsupported,
    int_list,
    template_kwargs,
)
from rl_rollout.engine import Engine
from rl_rollout.openai_stream import StreamedResponse, stream_chunks
from rl_rollout.openai_tools import TOOL_PARSERS, ToolParser, openai_tool_calls
from rl_rollout.openai_trace import TraceCall, TraceRecorder
from rl_rollout.params import SamplingParams

__all__ = ["EPISODE_HEADERS", "OpenAIError", "OpenAIRoutes"]

#: Request headers naming the episode a call belongs to (first found wins; then ``user``).
EPISODE_HEADERS = ("x-episode-id", "x-session-id")


class OpenAIRoutes:
    """Answers the OpenAI-compatible routes for one engine and its tokenizer.

    Args:
        engine: The engine that samples (any :class:`~rl_rollout.Engine`).
        tokenizer: Its tokenizer (chat template, decoding); default ``engine.tokenizer``.
        model_name: The one model name the routes accept and report.
        traces: Where calls that name an episode are recorded (default: a new recorder).
        tool_parser: Reads tool calls out of a chat reply's text when the request has
            ``tools`` (``"hermes"``, or a :data:`~rl_rollout.openai_tools.ToolParser`); None
            answers with the text only.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any = None,
        *,
        model_name: str = "policy",
        traces: TraceRecorder | None = None,
        tool_parser: ToolParser | str | None = None,
    ) -> None:
        if isinstance(tool_parser, str):
            if tool_parser not in TOOL_PARSERS:
                raise ValueError(
                    f"`tool_parser` {tool_parser!r} is unknown; use one of {sorted(TOOL_PARSERS)} "
                    "or a callable text -> (content, calls)"
                )
            tool_parser = TOOL_PARSERS[tool_parser]
        self.tool_parser = tool_parser
        self.engine = engine
        self.tokenizer: Any = (
            tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        )
        self.model_name = model_name
        self.traces = traces if traces is not None else TraceRecorder()
        self.max_model_len: int | None = getattr(engine, "max_model_len", None)
        self.created = int(time.time())

    # -- dispatch ------------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        """The ``GET /v1/models`` answer."""
        card = {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "rl-rollout", "max_model_len": self.max_model_len}  # fmt: skip
        return {"object": "list", "data": [card]}

    def model(self, model_id: str) -> dict[str, Any]:
        """The ``GET /v1/models/{model_id}`` answer; :class:`OpenAIError` 404 for another id."""
        self._check_model(model_id)
        card: dict[str, Any] = self.models()["data"][0]
        return card

    def handle(
        self, path: str, body: bytes, headers: Mapping[str, str]
    ) -> dict[str, Any] | StreamedResponse:
        """Answer a POST to ``path``; raises :class:`OpenAIError` for bad input.

        A request with ``stream: true`` gets a :class:`~rl_rollout.openai_stream.StreamedResponse`
        (server-sent events, sent after sampling), any other the response object.
        """
        routes = {
            "/v1/chat/completions": self.chat,
            "/v1/completions": self.completions,
            "/inference/v1/generate": self.generate,
        }
        if path not in routes:
            raise OpenAIError(f"no route {path}; routes: {sorted(routes)}", status=404)
        try:
            request = json.loads(body or b"null")
        except ValueError as exc:
            raise OpenAIError(f"the request body is not valid JSON ({exc})", param="body") from exc
        if not isinstance(request, dict):
            raise OpenAIError("the request body must be a JSON object", param="body")
        if self.tokenizer is None:
            raise OpenAIError(
                "the server has no tokenizer: start it with RolloutServer(engine, tokenizer=...)",
                status=400,
            )
        episode = next((headers[h] for h in EPISODE_HEADERS if headers.get(h)), None)
        if episode is None and isinstance(request.get("user"), str) and request["user"]:
            episode = request["user"]
        answer = routes[path](request, episode)
        if request.get("stream"):  # checked by the route: chat and completions only
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            return StreamedResponse(tuple(stream_chunks(answer, include_usage=usage)))
        return answer

    # -- routes --------------------------------------------------------------------------------

    def chat(self, request: dict[str, Any], episode: str | None) -> dict[str, Any]:
        """``POST /v1/chat/completions``."""
        self._check_common(request, "chat")
        logprobs = bool(check(request.get("logprobs") or False, bool, "logprobs", "a boolean"))
        top = check(request.get("top_logprobs") or 0, int, "top_logprobs", "an int")
        if top != 0:
            raise OpenAIError(
                f"`top_logprobs` must be 0 or null, got {top}: the engine records the log-prob "
                "of the sampled token only (set `logprobs: true`)",
                param="top_logprobs",
            )
        prompt = self._render(request)
        params = self._sampling(request, [prompt], "messages")
        out = self._sample("chat", [prompt], params, episode)
        parse = (
            self.tool_parser
            if request.get("tools") and request.get("tool_choice") != "none"
            else None
        )
        choices = []
        for k, c in enumerate(out[0]):
            message: dict[str, Any] = {"role": "assistant", "content": c["text"]}
            finish = c["finish_reason"]
            content, calls = parse(c["text"]) if parse is not None else (c["text"], [])
            if calls:  # the sampled ids stay as they were; only the message is structured
                message = {"role": "assistant", "content": content or None,
                           "tool_calls": openai_tool_calls(calls)}  # fmt: skip
                finish = "tool_calls" if finish == "stop" else finish
            choices.append({
                "index": k, "message": message, "finish_reason": finish,
                "logprobs": {"content": c["content"]} if logprobs else None,
                "token_ids": c["token_ids"],
            })  # fmt: skip
        return self._response("chat.completion", choices, [prompt], prompt_token_ids=prompt)

    def completions(self, request: dict[str, Any], episode: str | None) -> dict[str, Any]:
        """``POST /v1/completions``."""
        self._check_common(request, "completions")
        for name in ("echo", "suffix"):
            if request.get(name):
                raise OpenAIError(f"`{name}` is not supported; leave it unset", param=name)
        logprobs = request.get("logprobs")
        if logprobs is not None:
            check(logprobs, int, "logprobs", "an int")
            if not 0 <= logprobs <= 1:
                raise OpenAIError(
                    f"`logprobs` must be 0 or 1, got {logprobs}: the engine records the log-prob "
                    "of the sampled token only",
                    param="logprobs",
                )
        prompts = self._prompts(request.get("prompt"))
        params = self._sampling(request, prompts, "prompt")
        out = self._sample("completions", prompts, params, episode)
        choices: list[dict[str, Any]] = []
        for i, samples in enumerate(out):
            for c in samples:
                offsets = [0]
                for token in c["tokens"][:-1]:
                    offsets.append(offsets[-1] + len(token))
                choices.append({
                    "index": len(choices),
                    "text": c["text"],
                    "logprobs": None if logprobs is None else {
                        "tokens": c["tokens"], "token_logprobs": c["logprobs"],
                        "top_logprobs": None, "text_offset": offsets[: len(c["tokens"])],
                    },
                    "finish_reason": c["finish_reason"],
                    "token_ids": c["token_ids"],
                    "prompt_token_ids": prompts[i],
                })  # fmt: skip
        return self._response("text_completion", choices, prompts)

    def generate(self, request: dict[str, Any], episode: str | None) -> dict[str, Any]:
        """``POST /inference/v1/generate``: token ids in, token ids and log-probs out."""
        if request.get("model") is not None:
            self._check_model(request["model"])
        check_fields(request, "generate")
        if "token_ids" not in request:
            raise OpenAIError("`token_ids` is required (the prompt's token ids)", param="token_ids")
        prompt = int_list(request["token_ids"], "token_ids")
        sampling = request.get("sampling_params") or {}
        check(sampling, dict, "sampling_params", "an object")
        check_sampling_params(sampling)
        if sampling.get("top_k") == -1:  # vLLM's "off"
            sampling = {**sampling, "top_k": 0}
        params = self._sampling(sampling, [prompt], "token_ids", prefix="sampling_params.")
        logprobs = sampling.get("logprobs")
        if logprobs is not None:
            check(logprobs, int, "sampling_params.logprobs", "an int")
            if not 0 <= logprobs <= 1:
                raise OpenAIError(
                    f"`sampling_params.logprobs` must be 0 or 1, got {logprobs}: the engine "
                    "records the log-prob of the sampled token only",
                    param="sampling_params.logprobs",
                )
        out = self._sample("generate", [prompt], params, episode)
        choices = [
            {
                "index": k,
                "token_ids": c["token_ids"],
                "logprobs": None if logprobs is None else {"content": c["content"]},
                "finish_reason": c["finish_reason"],
            }
            for k, c in enumerate(out[0])
        ]
        return {"request_id": f"gen-{uuid.uuid4().hex}", "choices": choices,
                "prompt_logprobs": None, "usage": self._usage([prompt], choices)}  # fmt: skip

    # -- request parsing -----------------------------------------------------------------------

    def _check_model(self, model: Any) -> None:
        if model != self.model_name:
            raise OpenAIError(
                f"`model` {model!r} is not served here; this server serves {self.model_name!r} "
                "(GET /v1/models)",
                param="model",
                status=404,
                code="model_not_found",
            )

    def _check_common(self, request: dict[str, Any], route: str) -> None:
        if "model" not in request:
            raise OpenAIError(f"`model` is required; use {self.model_name!r}", param="model")
        self._check_model(request["model"])
        check_fields(request, route)
        check_unsupported(request, "")

    def _render(self, request: dict[str, Any]) -> list[int]:
        rendered = chat_messages(request.get("messages"))
        tools = chat_tools(request)
        kwargs = template_kwargs(request)
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise OpenAIError(
                "the tokenizer has no chat template; set `tokenizer.chat_template` or use "
                "/v1/completions",
                param="messages",
            )
        add = check(request.get("add_generation_prompt", True), bool, "add_generation_prompt",
                    "a boolean")  # fmt: skip
        cont = check(request.get("continue_final_message", False), bool,
                     "continue_final_message", "a boolean")  # fmt: skip
        try:
            ids = self.tokenizer.apply_chat_template(
                rendered, tools=tools, add_generation_prompt=add and not cont,
                continue_final_message=cont, tokenize=True, return_dict=False, **kwargs,
            )  # fmt: skip
        except Exception as exc:  # a template's raise_exception, a bad role, a bad kwarg
            raise OpenAIError(
                f"the chat template could not render `messages`: {exc}", param="messages"
            ) from exc
        return [int(t) for t in ids]

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise OpenAIError(
                "`prompt` must be a string, a list of strings, a list of token ids or a list of "
                "such lists (non-empty)",
                param="prompt",
            )
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = [prompt]
        out = []
        for i, p in enumerate(prompt):
            ids = (
                list(self.tokenizer(p, add_special_tokens=False)["input_ids"])
                if isinstance(p, str)
                else int_list(p, f"prompt[{i}]")
            )
            if not ids:
                raise OpenAIError(f"`prompt[{i}]` is empty", param="prompt")
            out.append([int(t) for t in ids])
        return out

    def _sampling(
        self,
        request: Mapping[str, Any],
        prompts: Sequence[Sequence[int]],
        prompt_field: str,
        prefix: str = "",
    ) -> SamplingParams:
        """SamplingParams of the request, with ``max_tokens`` checked against the engine."""
        kwargs: dict[str, Any] = {"return_logprobs": True}
        for name, target in SAMPLING_FIELDS.items():
            value = request.get(name)
            if value is None:
                continue
            kind = (int, float) if name in {"temperature", "top_p", "min_p",
                                            "repetition_penalty"} else int  # fmt: skip
            kwargs[target] = check(value, kind, prefix + name, "a number")
            if name == "seed" and not -(2**63) <= value < 2**64:  # a torch generator's range
                raise OpenAIError(
                    f"`{prefix}seed` must be an int in [-2**63, 2**64), got {value}",
                    param=prefix + "seed",
                )
        stop = request.get("stop")
        if stop is not None:
            stop = [stop] if isinstance(stop, str) else stop
            if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
                raise OpenAIError(
                    f"`{prefix}stop` must be a string or a list of non-empty strings",
                    param=prefix + "stop",
                )
            kwargs["stop"] = tuple(stop)
        if request.get("stop_token_ids") is not None:
            ids = int_list(request["stop_token_ids"], prefix + "stop_token_ids")
            kwargs["stop_token_ids"] = tuple(ids)
        if request.get("allowed_token_ids") is not None:
            kwargs["logit_mask"] = self._allowed(request["allowed_token_ids"], prefix)
        kwargs["max_new_tokens"] = self._max_tokens(request, prompts, prompt_field, prefix)
        try:
            return SamplingParams(**kwargs)
        except ValueError as exc:  # SamplingParams names its own field; name the request's
            found = re.search(r"`(\w+)`", str(exc))
            if found is None:
                raise OpenAIError(str(exc)) from exc
            name = REVERSE_FIELDS.get(found.group(1), found.group(1))
            message = str(exc).replace(f"`{found.group(1)}`", f"`{prefix}{name}`", 1)
            raise OpenAIError(message, param=prefix + name) from exc

    def _allowed(self, value: Any, prefix: str) -> torch.Tensor:
        """The [V] logit mask of vLLM's ``allowed_token_ids``."""
        allowed = int_list(value, prefix + "allowed_token_ids")
        vocab = self._vocab_size()
        if not allowed or max(allowed) >= vocab:
            raise OpenAIError(
                f"`{prefix}allowed_token_ids` must be non-empty ids below the vocabulary "
                f"size {vocab}",
                param=prefix + "allowed_token_ids",
            )
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[torch.tensor(allowed, dtype=torch.long)] = True
        return mask

    def _max_tokens(
        self,
        request: Mapping[str, Any],
        prompts: Sequence[Sequence[int]],
        prompt_field: str,
        prefix: str,
    ) -> int:
        """``max_tokens`` (or ``max_completion_tokens``; default: the room left), checked."""
        longest = max(len(p) for p in prompts)
        room = None if self.max_model_len is None else self.max_model_len - longest
        if room is not None and room < 1:
            raise OpenAIError(
                f"`{prompt_field}` is {longest} tokens long, which leaves no room to generate "
                f"within the engine's max_model_len = {self.max_model_len}; shorten it",
                param=prompt_field,
            )
        given = [k for k in ("max_tokens", "max_completion_tokens") if request.get(k) is not None]
        if len(given) == 2:
            raise OpenAIError(
                f"`{prefix}max_tokens` and `{prefix}max_completion_tokens` are both set; pass "
                "one of them",
                param=prefix + "max_completion_tokens",
            )
        if not given:
            if room is None:
                raise OpenAIError(
                    f"`{prefix}max_tokens` is required: the engine does not report its "
                    "max_model_len",
                    param=prefix + "max_tokens",
                )
            return room
        name = prefix + given[0]
        max_tokens = check(request[given[0]], int, name, "an int")
        if max_tokens < 1:
            raise OpenAIError(f"`{name}` must be >= 1, got {max_tokens}", param=name)
        if room is not None and max_tokens > room:
            raise OpenAIError(
                f"`{name}` = {max_tokens} plus the {longest} tokens of `{prompt_field}` exceeds "
                f"the engine's max_model_len = {self.max_model_len}; ask for at most {room}",
                param=name,
            )
        return int(max_tokens)

    def _vocab_size(self) -> int:
        size = getattr(self.engine, "vocab_size", None)
        config = getattr(getattr(self.engine, "model", None), "config", None)
        if size is None and config is not None:
            size = getattr(config, "vocab_size", None)
        return int(size if size is not None else len(self.tokenizer))

    # -- sampling and answers ------------------------------------------------------------------

    def _sample(
        self, route: str, prompts: list[list[int]], params: SamplingParams, episode: str | None
    ) -> list[list[dict[str, Any]]]:
        """Per prompt, per choice: token ids, log-probs, token strings, text, finish reason."""
        try:
            result = self.engine.generate(prompts, params)
        except ValueError as exc:  # the engine's own checks (e.g. a logit mask's size)
            raise OpenAIError(f"the engine refused the request: {exc}") from exc
        assert result.logprobs is not None
        lengths = result.completion_lengths.tolist()
        out: list[list[dict[str, Any]]] = [[] for _ in prompts]
        for r, length in enumerate(lengths):
            ids = result.completion_ids[r, :length].tolist()
            lps = result.logprobs[r, :length].tolist()
            tokens = [self.tokenizer.decode([t]) for t in ids]
            content = [
                {"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                for s, lp in zip(tokens, lps, strict=True)
            ]
            out[r // params.n].append({
                "token_ids": ids, "logprobs": lps, "tokens": tokens, "content": content,
                "text": result.texts[r], "finish_reason": result.finish_reasons[r],
            })  # fmt: skip
        if episode is not None:
            for prompt, samples in zip(prompts, out, strict=True):
                self.traces.record(
                    episode,
                    TraceCall(
                        route=route,
                        prompt_ids=tuple(prompt),
                        completion_ids=tuple(tuple(c["token_ids"]) for c in samples),
                        logprobs=tuple(tuple(c["logprobs"]) for c in samples),
                        finish_reasons=tuple(c["finish_reason"] for c in samples),
                    ),
                )
        return out

    @staticmethod
    def _usage(prompts: list[list[int]], choices: list[dict[str, Any]]) -> dict[str, int]:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip

    def _response(
        self, kind: str, choices: list[dict[str, Any]], prompts: list[list[int]], **extra: Any
    ) -> dict[str, Any]:
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": self._usage(prompts, choices),
            **extra,
        }
