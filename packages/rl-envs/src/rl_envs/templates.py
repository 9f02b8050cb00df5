"""Conversation templates: ``{placeholder}`` messages rendered into a prompt for one dataset row.

A template is a list of messages ``[{"role", "content"}]`` whose contents are read like
``str.format`` strings: ``{name}`` is a placeholder, ``{{`` and ``}}`` are literal braces, and brace
groups that are not names (JSON objects, LaTeX ``{1}``, ``{}``) stay as written.
:class:`rl_envs.ReasoningGym` checks every placeholder against its datasets' columns.
"""

from __future__ import annotations

import difflib
import json
import string
from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["check_rendered", "is_conversation", "render_dataset_prompt", "render_prompt"]

Message = dict[str, str]


def _where(index: int, message: Message) -> str:
    return f"message {index} ({message.get('role')!r})"


def _template_parts(
    content: str, names: Collection[str], where: str
) -> list[tuple[str, str | None]]:
    """One message's content as ``(literal text, placeholder name or None)`` pairs, in order.

    The content is read like a ``str.format`` string (``string.Formatter().parse``): ``{{`` and
    ``}}`` are literal braces. A field is a placeholder when its name is a Python identifier or
    one of ``names`` (a column whose name is not an identifier); any other field (a JSON object
    such as ``{"k": 1}``, a LaTeX group such as ``{1}``, an empty ``{}``) is kept as written.

    Args:
        content: The message's ``content`` string.
        names: Names that are placeholders even when they are not identifiers.
        where: The message, for error messages (e.g. ``"message 0 ('user')"``).

    Returns:
        The pieces; their texts (with the placeholders filled in) make up the message.

    Raises:
        ValueError: A lone ``{`` or ``}``, or a placeholder with a conversion or format spec.
    """
    try:
        parsed = list(string.Formatter().parse(content))
    except ValueError as exc:
        raise ValueError(
            f"`conversation_template` {where} is not a valid template ({exc}): write a literal "
            "brace as '{{' or '}}'"
        ) from None
    parts: list[tuple[str, str | None]] = []
    for literal, key, spec, conversion in parsed:
        if key is None:
            parts.append((literal, None))
            continue
        written = "{" + key + (f"!{conversion}" if conversion else "")
        written += (f":{spec}" if spec else "") + "}"
        if not (key.isidentifier() or key in names):
            parts.append((literal + written, None))
        elif conversion or spec:
            raise ValueError(
                f"`conversation_template` {where} has the placeholder {written}: placeholders "
                f"take no conversion or format spec, write {{{key}}}; to keep the braces as "
                f"text, double them: {{{written}}}"
            )
        else:
            parts.append((literal, key))
    return parts


def _unknown_placeholders(
    unknown: Sequence[tuple[str, str]], available: Sequence[str], source: str
) -> str:
    """The error text for placeholders (``(where, name)``) that ``available`` does not name."""
    lines = []
    for where, name in unknown:
        close = difflib.get_close_matches(name, available, n=1)
        hint = f" (did you mean {{{close[0]}}}?)" if close else ""
        lines.append(
            f"`conversation_template` {where} has the placeholder {{{name}}}, which is not "
            f"{source}{hint}"
        )
    first = unknown[0][1]
    return (
        "; ".join(lines) + f". Available: {sorted(available)}. Fix the placeholder or the data; "
        f"to keep braces as text, double them: {{{{{first}}}}}"
    )


def render_prompt(
    tokenizer: Any, conversation_template: Sequence[Message], row: dict[str, Any]
) -> str:
    r"""The prompt text for ``row``: each ``{name}`` in the template replaced by ``row[name]``.

    The contents are read like ``str.format`` strings: ``{{`` and ``}}`` are literal braces.
    Placeholders are fields named by a Python identifier (or by a key of ``row``); other
    brace groups (JSON objects, LaTeX such as ``\frac{1}{2}`` or ``\boxed{}``) stay as
    they are. With a tokenizer chat template the messages go through ``apply_chat_template``
    (with the generation prompt); without one, the message contents are joined by newlines.

    Args:
        tokenizer: A Hugging Face tokenizer (its ``chat_template``, if any, is used).
        conversation_template: Messages ``[{"role", "content"}]``.
        row: The values of the placeholders.

    Returns:
        The rendered prompt.

    Raises:
        ValueError: A placeholder names no key of ``row`` (the message says which, and the
            keys), a content is not a valid template (a lone brace), or the chat template drops
            a message (:func:`check_rendered`).
    """
    messages = []
    for index, message in enumerate(conversation_template):
        where = _where(index, message)
        pieces = []
        for text, name in _template_parts(str(message["content"]), row, where):
            pieces.append(text)
            if name is None:
                continue
            if name not in row:
                raise ValueError(
                    _unknown_placeholders([(where, name)], list(row), "a key of the row")
                )
            pieces.append(str(row[name]))
        messages.append({"role": message["role"], "content": "".join(pieces)})
    if getattr(tokenizer, "chat_template", None):
        text = str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
        check_rendered(messages, text, "`conversation_template`")
        return text
    return "\n".join(m["content"] for m in messages)


def check_rendered(messages: Sequence[dict[str, Any]], text: str, where: str) -> None:
    """Raise when the chat template left a message out of its rendering ``text``.

    A template that chains the roles it knows (``if role == 'user' ... elif ...``) drops any
    other role (ShareGPT's ``human``, a typo) without a word. A message is dropped when its
    text content (stripped, or JSON-escaped as ``tojson`` writes it) is not in ``text``;
    assistant messages (templates may rewrite them, e.g. drop past reasoning) and empty or
    non-text contents are not checked.

    Args:
        messages: The messages rendered.
        text: Their rendering (or the part of it they produced).
        where: What the messages are, for the message (e.g. ``"the prompt of row 3 ..."``).

    Raises:
        ValueError: A message's content is not in ``text`` (the message names its index, its
            role and ``where``).
    """
    for index, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") == "assistant" or not isinstance(content, str):
            continue
        content = content.strip()
        if content and content not in text and json.dumps(content)[1:-1] not in text:
            raise ValueError(
                f"the chat template dropped message {index} (role {message.get('role')!r}) of "
                f"{where}: its content is not in the rendering; use a role the template renders "
                "(system, user, assistant, tool) or fix the template"
            )


def is_conversation(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of ``{"role", "content"}`` messages (TRL's conversational)."""
    return (
        isinstance(prompt, list | tuple)
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def render_dataset_prompt(tokenizer: Any, prompt: Any, where: str) -> str:
    """The text of a TRL-style ``prompt`` value: a string as is, a conversation templated.

    A conversation goes through the tokenizer's chat template with the generation prompt, or,
    when its last message is the assistant's, continuing that message (TRL's behaviour).

    Args:
        tokenizer: A Hugging Face tokenizer.
        prompt: A string, or a list of ``{"role", "content"}`` messages.
        where: The row, for error messages (e.g. ``"row 3 of the train dataset"``).

    Returns:
        The prompt text.

    Raises:
        ValueError: The value is neither, a conversation meets a tokenizer without a chat
            template (the message says how to set one), or the template drops a message
            (:func:`check_rendered`).
    """
    if isinstance(prompt, str):
        return prompt
    if not is_conversation(prompt):
        raise ValueError(
            f"the prompt of {where} must be a string or a list of {{'role', 'content'}} "
            f"messages, got {type(prompt).__name__}: {str(prompt)[:80]!r}"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the prompt of {where} is a conversation but the tokenizer has no chat template: "
            "set tokenizer.chat_template to a Jinja template (e.g. the model's instruct "
            "template), or give the prompts as plain strings"
        )
    messages = [dict(m) for m in prompt]
    last_is_assistant = messages[-1]["role"] == "assistant"
    text = str(
        tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not last_is_assistant,
            continue_final_message=last_is_assistant,
        )
    )
    check_rendered(messages, text, f"the prompt of {where}")
    return text
