"""Tool calls (parsed from the model's text) and an environment's tools with their JSON schemas."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RESERVED",
    "ToolCall",
    "ToolCallParseError",
    "ToolCallParser",
    "parse_compact_tool_calls",
    "parse_hermes_tool_calls",
    "tool_methods",
    "tool_schemas",
]

#: Methods of an environment that are never tools.
RESERVED = frozenset({"reset", "get_reward"})


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``tool(*args, **arguments)``."""

    name: str
    """The tool's (method's) name."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments (JSON ``"arguments"``)."""
    args: tuple[Any, ...] = ()
    """Positional arguments (the compact syntax)."""


class ToolCallParseError(ValueError):
    """The action holds a call that cannot be parsed (answered with an error tool message)."""


ToolCallParser = Callable[[str, Mapping[str, Callable[..., Any]]], list[ToolCall]]
"""``parser(text, tools) -> calls`` (empty: the text is a final answer); raises
:class:`ToolCallParseError` for a malformed call."""

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes_tool_calls(text: str, tools: Mapping[str, Callable[..., Any]]) -> list[ToolCall]:
    """Calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    The Hermes / Qwen2.5 convention (TRL's default): one JSON object per tag; a missing closing
    tag at the end of the text is tolerated (generation cut by the budget).

    Args:
        text: The decoded action.
        tools: Unused (the names are checked when the calls run).

    Returns:
        The calls in order; empty when the text holds no ``<tool_call>`` tag.

    Raises:
        ToolCallParseError: a tag whose body is not ``{"name": str, "arguments": object}``.
    """
    del tools
    calls = []
    for body in _HERMES.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ToolCallParseError(f"the tool call is not valid JSON ({exc.msg})") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            raise ToolCallParseError('a tool call must be {"name": ..., "arguments": {...}}')
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models emit the arguments JSON-encoded
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise ToolCallParseError("the tool call's arguments are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise ToolCallParseError("the tool call's arguments must be a JSON object")
        calls.append(ToolCall(payload["name"], dict(arguments)))
    return calls


_COMPACT = re.compile(r"!([a-z_][a-z0-9_]*)?(?:\((.*)\))?\s*", re.DOTALL)


def parse_compact_tool_calls(text: str, tools: Mapping[str, Callable[..., Any]]) -> list[ToolCall]:
    """One call written as ``!name(arg1,arg2)``, for tiny character vocabularies.

    The text is a call when it starts with ``!``. ``name`` may be shortened to any prefix that
    names exactly one tool, and left out when the environment has a single tool; the
    parenthesised, comma-separated positional arguments are optional (strings; the tool's
    annotations ``int``/``float`` convert them when it runs). ``"!"`` alone calls the only
    tool without arguments.

    Args:
        text: The decoded action.
        tools: The environment's tools by name.

    Returns:
        ``[ToolCall]`` for a call, ``[]`` for a final answer (text not starting with ``!``).

    Raises:
        ToolCallParseError: a malformed call, an ambiguous or unknown name.
    """
    if not text.startswith("!"):
        return []
    match = _COMPACT.fullmatch(text)
    if match is None:
        raise ToolCallParseError(f"cannot parse the call {text!r}; write !name(arg1,arg2)")
    prefix, body = match.group(1) or "", match.group(2)
    names = [n for n in tools if n.startswith(prefix)]
    if prefix in tools:
        names = [prefix]
    if len(names) != 1:
        known = ", ".join(tools)
        what = "unknown" if not names else "ambiguous"
        raise ToolCallParseError(f"{what} tool name {prefix!r}; tools: {known}")
    args = () if not body else tuple(a.strip() for a in body.split(","))
    return [ToolCall(names[0], args=args)]


def tool_methods(environment: Any) -> dict[str, Callable[..., Any]]:
    """The public methods of ``environment`` that are tools (all but ``reset``/``get_reward``).

    Args:
        environment: An ``environment_factory``-style object.

    Returns:
        ``{name: bound method}`` in definition order of the class.
    """
    out: dict[str, Callable[..., Any]] = {}
    for cls in reversed(type(environment).__mro__[:-1]):  # base classes first, not `object`
        for name in vars(cls):
            if name.startswith("_") or name in RESERVED:
                continue
            value = getattr(environment, name)
            if inspect.ismethod(value):
                out.setdefault(name, value)
    return out


def tool_schemas(environment: Any) -> list[dict[str, Any]]:
    """The JSON schemas of the tools (``transformers.utils.get_json_schema``, TRL's way).

    Args:
        environment: An ``environment_factory``-style object.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.

    Raises:
        ValueError: a tool without a docstring or type hints, or one taking ``*args`` or
            ``**kwargs`` (the error names the tool).
    """
    from transformers.utils.chat_template_utils import get_json_schema

    schemas = []
    for name, method in tool_methods(environment).items():
        for param in inspect.signature(method).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                star = "*" if param.kind is param.VAR_POSITIONAL else "**"
                raise ValueError(
                    f"tool {name!r} takes {star}{param.name}, which a JSON tool call cannot pass: "
                    "give it named parameters (its schema would name a required argument "
                    f"{param.name!r})"
                )
        try:
            schemas.append(get_json_schema(method))
        except Exception as exc:
            raise ValueError(
                f"tool {name!r} needs a docstring with an Args section and type hints for its "
                f"schema ({type(exc).__name__}: {exc})"
            ) from exc
    return schemas


# JSON schema type -> the Python values a parsed JSON argument of that type can be
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,), "null": (type(None),),
}  # fmt: skip
_ARTICLE = {"integer": "an integer", "array": "an array", "object": "an object"}


def _fits(value: Any, kind: str) -> bool:
    if kind not in _JSON_TYPES:  # a type the check does not know: left to the tool
        return True
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False  # JSON true is not a count
    return isinstance(value, _JSON_TYPES[kind])


def argument_errors(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> list[str]:
    """What is wrong with a call's arguments against its tool's JSON schema ``parameters``.

    Checks each argument's JSON type (``type``, one or a list; ``nullable``), ``enum`` and the
    type of an array's ``items``; a parameter without a type is not checked.

    Args:
        arguments: The bound arguments, by parameter name (after the compact parser's string
            conversion).
        parameters: The ``parameters`` object of the tool's schema (:func:`tool_schemas`).

    Returns:
        One sentence per wrong argument (empty when all fit).
    """
    properties = parameters.get("properties") or {}
    errors = []
    for name, value in arguments.items():
        spec = properties.get(name) or {}
        kinds = spec.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if spec.get("nullable") and value is None:
            continue
        if kinds and not any(_fits(value, k) for k in kinds):
            want = " or ".join(_ARTICLE.get(k, f"a {k}") for k in kinds)
            errors.append(f"`{name}` must be {want}, got {value!r:.40} ({type(value).__name__})")
        elif "enum" in spec and value not in spec["enum"]:
            errors.append(f"`{name}` must be one of {spec['enum']}, got {value!r:.40}")
        elif "array" in kinds and isinstance(value, list | tuple):
            item = (spec.get("items") or {}).get("type")
            bad = [v for v in value if isinstance(item, str) and not _fits(v, item)]
            if bad and isinstance(item, str):
                kind = f"{item}s" if item in _JSON_TYPES else f"{item} values"
                errors.append(f"`{name}` must hold {kind}, got {bad[0]!r:.40}")
    return errors
