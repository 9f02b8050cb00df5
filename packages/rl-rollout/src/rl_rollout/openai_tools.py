"""Tool calls in the chat route's answers: a reply's text -> ``message.tool_calls``.

The chat template renders the request's ``tools``; the model answers in text, in whatever
format its template taught it. A *tool parser* ``text -> (content, calls)`` turns that text into
OpenAI's ``tool_calls`` (each call ``{"name": str, "arguments": dict}``), so an agent that reads
``message.tool_calls`` works unchanged. The sampled token ids, and so the training rows, are the
same whether or not a parser runs.

:func:`hermes_tool_calls` reads the Hermes / Qwen2.5 format,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["TOOL_PARSERS", "ToolParser", "hermes_tool_calls", "openai_tool_calls"]

#: ``text -> (content, [{"name": str, "arguments": dict}, ...])``
ToolParser = Callable[[str], tuple[str, list[dict[str, Any]]]]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Hermes-format calls in ``text`` and the text around them (stripped).

    A block that is not a JSON object with a string ``name`` and an object ``arguments`` is
    not a call: the text is returned unchanged, so the agent sees what the model wrote.
    """
    calls: list[dict[str, Any]] = []
    for block in _HERMES.findall(text):
        try:
            call = json.loads(block)
        except ValueError:
            return text, []
        valid = isinstance(call, dict) and isinstance(call.get("name"), str)
        if not valid or not isinstance(call.get("arguments", {}), dict):
            return text, []
        calls.append({"name": call["name"], "arguments": call.get("arguments", {})})
    if not calls:
        return text, []
    return _HERMES.sub("", text).strip(), calls


#: Tool parsers by name (``RolloutServer(tool_parser="hermes")``, ``--tool-parser hermes``).
TOOL_PARSERS: dict[str, ToolParser] = {"hermes": hermes_tool_calls}


def openai_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parsed calls as OpenAI's ``message.tool_calls`` (arguments as a JSON string)."""
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c in calls
    ]
