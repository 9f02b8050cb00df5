"""OpenAI's streaming form (``stream: true``) of a finished chat or text completion.

The engine samples a whole request at once (every choice of a batch in one ``generate``), so
nothing can be sent before the last token: a streamed answer is the finished completion cut
into OpenAI's server-sent events, after sampling. Per choice, in order:

- chat (``object: "chat.completion.chunk"``): a chunk with ``delta.role = "assistant"``; one
  with the whole ``delta.content`` (when there is text), its ``logprobs.content`` and the
  choice's ``token_ids``; one with ``delta.tool_calls`` (each call with its ``index``, ``id``,
  name and full ``arguments``) when the reply makes calls; then an empty delta with
  ``finish_reason``.
- completions (``object: "text_completion"``): one chunk with the whole ``text``, its
  ``logprobs``, ``token_ids`` and ``prompt_token_ids``; then one with ``text: ""`` and
  ``finish_reason``.

The whole text goes in one delta because single-token decodes need not add up to the text
(a multi-byte character split over two tokens, a stop string cut from the end). The first
chunk carries the response's ``prompt_token_ids`` (chat). With ``stream_options.include_usage``
every chunk has ``usage: null`` and a last chunk with no choices carries the usage, as OpenAI
sends it. The stream ends with ``data: [DONE]``. Accumulating the deltas (as the ``openai``
client's ``chat.completions.stream`` does) gives back the non-streamed answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamedResponse", "stream_chunks"]


@dataclass(frozen=True)
class StreamedResponse:
    """A finished response to send as server-sent events.

    Attributes:
        chunks: The chunk objects, in order (:func:`stream_chunks`).
    """

    chunks: tuple[dict[str, Any], ...]

    def events(self) -> Iterator[bytes]:
        r"""Each chunk as ``data: {json}\n\n``, then ``data: [DONE]\n\n``."""
        for chunk in self.chunks:
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


def stream_chunks(response: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The streamed chunks of a finished ``chat.completion`` or ``text_completion`` response.

    Args:
        response: The answer :class:`~rl_rollout.openai_api.OpenAIRoutes` gives without
            ``stream``.
        include_usage: ``stream_options.include_usage``: a last chunk with the usage and no
            choices (and ``usage: null`` on the others).

    Returns:
        The chunk objects in the order they are sent.
    """
    kind = response["object"]
    if kind not in ("chat.completion", "text_completion"):
        raise ValueError(f"`response` of object {kind!r} has no streamed form")
    chat = kind == "chat.completion"
    head = {"id": response["id"], "object": "chat.completion.chunk" if chat else kind,
            "created": response["created"], "model": response["model"]}  # fmt: skip
    chunks: list[dict[str, Any]] = []

    def emit(choice: dict[str, Any], **extra: Any) -> None:
        chunk = {**head, "choices": [choice], **extra}
        if include_usage:
            chunk["usage"] = None
        chunks.append(chunk)

    for choice in response["choices"]:
        index = choice["index"]
        if not chat:
            emit({"index": index, "text": choice["text"], "logprobs": choice["logprobs"],
                  "finish_reason": None, "token_ids": choice["token_ids"],
                  "prompt_token_ids": choice["prompt_token_ids"]})  # fmt: skip
            emit({"index": index, "text": "", "logprobs": None,
                  "finish_reason": choice["finish_reason"]})  # fmt: skip
            continue
        message = choice["message"]
        first = {"prompt_token_ids": response["prompt_token_ids"]} if not chunks else {}
        emit({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
              "finish_reason": None}, **first)  # fmt: skip
        if message["content"]:
            emit({"index": index, "delta": {"content": message["content"]},
                  "logprobs": choice["logprobs"], "finish_reason": None,
                  "token_ids": choice["token_ids"]})  # fmt: skip
        else:  # no text: the sampled ids and log-probs still reach the client
            emit({"index": index, "delta": {}, "logprobs": choice["logprobs"],
                  "finish_reason": None, "token_ids": choice["token_ids"]})  # fmt: skip
        calls = message.get("tool_calls")
        if calls:
            deltas = [{"index": i, **call} for i, call in enumerate(calls)]
            emit({"index": index, "delta": {"tool_calls": deltas}, "logprobs": None,
                  "finish_reason": None})  # fmt: skip
        emit({"index": index, "delta": {}, "logprobs": None,
              "finish_reason": choice["finish_reason"]})  # fmt: skip
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks
