"""The checks of an OpenAI-compatible request: which fields each route reads, and their values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "REVERSE_FIELDS",
    "SAMPLING_FIELDS",
    "OpenAIError",
    "chat_messages",
    "chat_tools",
    "check",
    "check_fields",
    "check_sampling_params",
    "check_unsupported",
    "int_list",
    "template_kwargs",
]

# OpenAI / vLLM request field -> SamplingParams field
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens",
    "n": "n",
    "seed": "seed",
}
# SamplingParams field -> the request field that sets it (to name it in an error)
REVERSE_FIELDS = {v: k for k, v in SAMPLING_FIELDS.items()} | {
    "max_new_tokens": "max_tokens",
    "logit_mask": "allowed_token_ids",
    "stop_token_ids": "stop_token_ids",
    "stop": "stop",
}
# token-route sampling fields read by OpenAIRoutes._sampling / check_unsupported / generate
_HANDLED = {
    "max_tokens", "max_completion_tokens", "stop", "stop_token_ids", "allowed_token_ids",
    "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "best_of",
}  # fmt: skip
# vLLM token-route sampling fields that do not change what is sampled (accepted and ignored)
_HARMLESS = {
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "detokenize", "output_kind", "return_token_ids", "flat_logprobs", "extra_args",
}  # fmt: skip
# the request fields each route reads (any other is refused by name, never ignored)
_COMMON_FIELDS = {
    "model", "n", "stop", "seed", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias", "top_k",
    "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "allowed_token_ids",
}  # fmt: skip
_ROUTE_FIELDS = {
    "chat": _COMMON_FIELDS | {
        "messages", "tools", "tool_choice", "logprobs", "top_logprobs", "chat_template_kwargs",
        "add_generation_prompt", "continue_final_message",
    },
    "completions": _COMMON_FIELDS | {"prompt", "logprobs", "echo", "suffix", "best_of"},
    "generate": {"model", "token_ids", "sampling_params", "stream"},
}  # fmt: skip
# apply_chat_template arguments the chat route sets itself (not `chat_template_kwargs`)
_TEMPLATE_ARGS = {"conversation", "tools", "add_generation_prompt", "continue_final_message",
                  "tokenize", "return_dict", "return_tensors"}  # fmt: skip
# fields that change nothing the routes sample or answer (bookkeeping of a hosted API)
_BOOKKEEPING = {"user", "metadata", "service_tier", "prompt_cache_key", "safety_identifier",
                "request_id", "cache_salt", "priority"}  # fmt: skip
# fields accepted at the value that is this server's behaviour, refused at any other
_DEFAULT_ONLY: dict[str, Any] = {
    "parallel_tool_calls": True, "store": False, "echo": False, "ignore_eos": False,
    "include_stop_str_in_output": False, "skip_special_tokens": True,
}  # fmt: skip


class OpenAIError(ValueError):
    """A request the server refuses; ``param`` names the offending field."""

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code

    def to_json(self) -> dict[str, Any]:
        """OpenAI's error body."""
        kind = {404: "not_found_error", 500: "server_error"}.get(
            self.status, "invalid_request_error"
        )
        return {
            "error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        }


def check(value: Any, types: type | tuple[type, ...], name: str, what: str) -> Any:
    """``value`` if it is of ``types`` (a bool only where ``bool`` is named), else OpenAIError."""
    # bool is an int in Python; a JSON true is never a count or a temperature
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        raise OpenAIError(f"`{name}` must be {what}, got {value!r}", param=name)
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def int_list(value: Any, name: str) -> list[int]:
    """``value`` as a list of token ids (ints >= 0), else OpenAIError naming ``name``."""
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise OpenAIError(f"`{name}` must be a list of token ids (ints >= 0)", param=name)
    return list(value)


def check_fields(request: Mapping[str, Any], route: str) -> None:
    """Refuse a field the route would ignore (unknown, or a behaviour it cannot give)."""
    stream = request.get("stream")
    if stream is not None:
        check(stream, bool, "stream", "a boolean")
        if stream and route == "generate":
            raise OpenAIError(
                "`stream` is not supported on the token route; set it to false (the chat and "
                "completions routes stream)",
                param="stream",
            )
    check_stream_options(request.get("stream_options"), bool(stream))
    for name, value in request.items():
        if value is None or name in _ROUTE_FIELDS[route] or name in _BOOKKEEPING:
            continue
        if name in _DEFAULT_ONLY:
            if value == _DEFAULT_ONLY[name] and type(value) is bool:
                continue
            raise OpenAIError(
                f"`{name}` = {value!r} is not supported: this server cannot give that "
                f"behaviour; leave it unset or pass {_DEFAULT_ONLY[name]!r}",
                param=name,
            )
        supported = sorted(_ROUTE_FIELDS[route])
        raise OpenAIError(
            f"`{name}` is not supported by this server (it would be ignored); leave it "
            f"unset. Supported fields: {supported}",
            param=name,
        )


def check_stream_options(options: Any, stream: bool) -> None:
    """Refuse ``stream_options`` without ``stream`` and options this server cannot give."""
    if options is None:
        return
    if not stream:
        raise OpenAIError(
            "`stream_options` is only read with `stream: true`; set `stream` or drop it",
            param="stream_options",
        )
    check(options, dict, "stream_options", "an object")
    for key, value in options.items():
        name = f"stream_options.{key}"
        if key == "include_usage":
            check(value, bool, name, "a boolean")
        elif key in ("continuous_usage_stats", "include_obfuscation"):
            if value is not False:
                raise OpenAIError(
                    f"`{name}` = {value!r} is not supported: the answer is streamed after "
                    "sampling, with the usage once at the end; leave it unset or pass false",
                    param=name,
                )
        else:
            raise OpenAIError(
                f"`{name}` is not supported; the options read are include_usage, "
                "continuous_usage_stats and include_obfuscation (false)",
                param=name,
            )


def check_unsupported(request: Mapping[str, Any], prefix: str) -> None:
    """Refuse the sampling fields the engine cannot give (penalties, ``logit_bias``, ...)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if request.get(name):
            raise OpenAIError(
                f"`{prefix}{name}` is not supported; use `repetition_penalty`",
                param=prefix + name,
            )
    if request.get("logit_bias"):
        raise OpenAIError(
            f"`{prefix}logit_bias` is not supported; use `allowed_token_ids`",
            param=prefix + "logit_bias",
        )
    best_of = request.get("best_of")
    if best_of is not None and best_of != request.get("n", 1):
        raise OpenAIError(
            f"`{prefix}best_of` is not supported; leave it unset", param=prefix + "best_of"
        )


def check_sampling_params(sampling: Mapping[str, Any]) -> None:
    """Refuse an unknown or unsupported field of the token route's ``sampling_params``."""
    given = {k for k, v in sampling.items() if v is not None}
    unknown = sorted(given - set(SAMPLING_FIELDS) - _HANDLED - _HARMLESS)
    if unknown:
        raise OpenAIError(
            f"unknown sampling parameters {unknown}; known: "
            f"{sorted(set(SAMPLING_FIELDS) | {'max_tokens', 'stop', 'logprobs'})}",
            param=f"sampling_params.{unknown[0]}",
        )
    check_unsupported(sampling, "sampling_params.")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's ``messages``, checked, with text content parts joined into one string."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("`messages` must be a non-empty list of messages", param="messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(
                f"`messages[{i}]` must be an object with a string `role`",
                param=f"messages[{i}]",
            )
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text can be rendered
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise OpenAIError(
                        f"`messages[{i}].content` has a part that is not text ({part!r}); "
                        "only text parts are supported",
                        param=f"messages[{i}].content",
                    )
                text = part.get("text")
                if not isinstance(text, str):
                    raise OpenAIError(
                        f"`messages[{i}].content[{j}].text` must be a string, got {text!r}",
                        param=f"messages[{i}].content[{j}].text",
                    )
                parts.append(text)
            rendered.append({**message, "content": "".join(parts)})
        elif content is None or isinstance(content, str):
            rendered.append(message)
        else:
            raise OpenAIError(
                f"`messages[{i}].content` must be a string or a list of text parts "
                f'([{{"type": "text", "text": ...}}]), got {content!r}',
                param=f"messages[{i}].content",
            )
    return rendered


def chat_tools(request: Mapping[str, Any]) -> list[Any] | None:
    """The request's ``tools`` (checked) for the template; None under ``tool_choice: none``."""
    tools = request.get("tools")
    names = []
    if tools is not None:
        check(tools, list, "tools", "a list of tool definitions")
        for i, entry in enumerate(tools):
            tool = entry if isinstance(entry, dict) else {}
            function = tool.get("function")
            function = function if isinstance(function, dict) else {}
            name = function.get("name")
            if tool.get("type") != "function" or not isinstance(name, str) or not name:
                raise OpenAIError(
                    f'`tools[{i}]` must be {{"type": "function", "function": {{"name": str, '
                    f'"parameters": {{...}}}}}}, got {entry!r}',
                    param=f"tools[{i}]",
                )
            parameters = function.get("parameters")
            if parameters is not None and not isinstance(parameters, dict):
                raise OpenAIError(
                    f"`tools[{i}].function.parameters` must be a JSON Schema object, got "
                    f"{parameters!r}",
                    param=f"tools[{i}].function.parameters",
                )
            names.append(name)
    choice = request.get("tool_choice")
    if choice is None or choice == "auto":
        return tools
    if choice == "none":
        return None
    wanted = choice.get("function") if isinstance(choice, dict) else None
    name = wanted.get("name") if isinstance(wanted, dict) else None
    if isinstance(name, str) and name not in names:
        raise OpenAIError(
            f"`tool_choice` names the tool {name!r}, which is not in `tools` ({names}); name "
            "a tool of `tools`, or pass 'auto' or 'none'",
            param="tool_choice",
        )
    if not names:
        raise OpenAIError(
            f"`tool_choice` = {choice!r} needs `tools` (the request has none); pass `tools` "
            "or leave `tool_choice` unset",
            param="tool_choice",
        )
    raise OpenAIError(
        f"`tool_choice` = {choice!r} is not supported: the server does not constrain "
        "decoding to a tool call; pass 'auto' (the model decides) or 'none'",
        param="tool_choice",
    )


def template_kwargs(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``chat_template_kwargs``, checked not to set what the route sets."""
    kwargs = request.get("chat_template_kwargs") or {}
    check(kwargs, dict, "chat_template_kwargs", "an object")
    reserved = sorted(set(kwargs) & _TEMPLATE_ARGS)
    if reserved:
        raise OpenAIError(
            f"`chat_template_kwargs` sets {reserved[0]!r}, which the server sets itself; "
            "use the request's own field (`tools`, `add_generation_prompt`, "
            "`continue_final_message`) or leave it out",
            param="chat_template_kwargs",
        )
    return dict(kwargs)
