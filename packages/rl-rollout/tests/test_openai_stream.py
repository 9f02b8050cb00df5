"""``stream: true`` on the OpenAI routes, read with the official ``openai`` client.

A streamed answer is the finished completion cut into server-sent events
(:mod:`rl_rollout.openai_stream`): accumulating the deltas gives back, field for field, the
answer the same request gets without ``stream`` (same engine, same seed, so the same ids).
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import string
import struct
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from rl_rollout import HFEngine, RolloutServer
from rl_rollout.openai_stream import stream_chunks
from rl_testing.tokenizer import DEFAULT_ALPHABET, char_tokenizer
from rollout_testlib import EOS, tiny

MODEL = "tiny-policy"
TEMPLATE = (
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[HFEngine, RolloutServer]]:
    tok = char_tokenizer(DEFAULT_ALPHABET + string.ascii_uppercase + '<>{}[]"_')
    tok.chat_template = TEMPLATE
    model, tok = tiny("qwen2", seed=5, tokenizer=tok)
    engine = HFEngine(model, tok, max_model_len=128)
    with RolloutServer(engine, model_name=MODEL) as server:
        yield engine, server


@pytest.fixture
def client(served: tuple[HFEngine, RolloutServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0,
                         timeout=120.0)  # fmt: skip


def extra(obj: Any, name: str) -> Any:
    """A field the ``openai`` types do not declare (vLLM's ``token_ids``, ...)."""
    return (obj.model_extra or {}).get(name)


def test_streamed_chat_accumulates_to_the_plain_answer(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL, "messages": [{"role": "user", "content": "2+3=?"}], "n": 2,
        "logprobs": True, "max_tokens": 6, "seed": 11, "extra_body": {"allowed_token_ids":
        [EOS, 40, 41, 42]},
    }  # fmt: skip
    plain = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert extra(chunks[0], "prompt_token_ids") == plain.prompt_token_ids
    *body, last = chunks
    assert last.choices == [] and last.usage == plain.usage
    assert all(c.usage is None for c in body)
    for want in plain.choices:
        mine = [c.choices[0] for c in body if c.choices[0].index == want.index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == want.message.content
        ids = [t for c in mine for t in extra(c, "token_ids") or []]
        assert ids == want.token_ids  # bit-exact: integer ids of the same seeded sampling
        got = [t for c in mine if c.logprobs is not None for t in c.logprobs.content or []]
        assert want.logprobs is not None
        assert got == want.logprobs.content  # the same JSON doubles, field for field
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [want.finish_reason]
    finishes = [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason]
    assert finishes == [w.finish_reason for w in plain.choices]  # once per choice


def test_streamed_tool_calls_are_the_plain_ones(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    _, server = served

    def parser(text: str) -> tuple[str, list[dict[str, Any]]]:
        return "", [{"name": "add", "arguments": {"a": 2}}, {"name": "add", "arguments": {}}]

    kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "add"}],
                          "tools": [TOOL], "max_tokens": 3, "seed": 2,
                          "extra_body": {"allowed_token_ids": [EOS]}}  # fmt: skip
    server.openai.tool_parser = parser
    try:
        plain = client.chat.completions.create(**kw)
        # the helper is chat.completions.stream; older openai releases have it in beta
        helper = (
            getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
        )
        with helper(**kw) as stream:
            final = stream.get_final_completion()
    finally:
        server.openai.tool_parser = None
    [want], [got] = plain.choices, final.choices
    assert want.message.tool_calls is not None and got.message.tool_calls is not None

    def calls(message: Any) -> list[tuple[str, str, str]]:
        return [(c.type, c.function.name, c.function.arguments) for c in message.tool_calls]

    assert calls(got.message) == calls(want.message)  # each answer draws its own call ids
    assert all(c.id.startswith("call_") for c in got.message.tool_calls)
    assert len(got.message.tool_calls) == 2
    assert not got.message.content and want.message.content is None
    assert got.finish_reason == want.finish_reason == "tool_calls"


def test_streamed_completions_accumulate_per_choice(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "prompt": ["1+1=", "hi"], "n": 2, "logprobs": 1,
                          "max_tokens": 5, "seed": 3}  # fmt: skip
    plain = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True))
    assert {c.object for c in chunks} == {"text_completion"}
    for want in plain.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == want.index]
        assert "".join(c.text for c in mine) == want.text
        assert [t for c in mine for t in extra(c, "token_ids") or []] == extra(want, "token_ids")
        assert extra(mine[0], "prompt_token_ids") == extra(want, "prompt_token_ids")
        assert mine[0].logprobs == want.logprobs
        assert [c.finish_reason for c in mine] == [None, want.finish_reason]


def test_the_wire_is_server_sent_events_ending_in_done(
    served: tuple[HFEngine, RolloutServer],
) -> None:
    engine, server = served
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "seed": 0, "stream": True,
            "user": "episode-s"}  # fmt: skip
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode())
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2]), raw
    [call] = server.traces.pop("episode-s")  # recorded once, like an answer without stream
    text = "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-2])
    assert engine.tokenizer.decode(call.completion_ids[0], skip_special_tokens=True) == text


def test_errors_come_before_the_stream(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert "'gpt-4o' is not served here" in str(info.value)


def test_stream_chunks_refuses_what_has_no_streamed_form() -> None:
    with pytest.raises(ValueError, match="object 'list' has no streamed form"):
        stream_chunks({"object": "list"}, include_usage=False)


def test_a_client_that_leaves_is_one_log_line_and_the_server_goes_on(
    served: tuple[HFEngine, RolloutServer],
    client: openai.OpenAI,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """It was a traceback on the server's stderr (socketserver's handle_error). Whether the
    reset reaches the server while it reads the request, samples (the generation is then
    cancelled) or answers, it is one line of the server's logger."""
    _, server = served
    caplog.set_level(logging.INFO, logger="rl_rollout.server")
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 32, "seed": 0,
                       "stream": True}).encode()  # fmt: skip
    head = f"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(head.encode() + body)
    sock.close()  # linger 0: a reset, as a killed client's
    deadline = time.monotonic() + 120  # a hang guard, not a speed limit
    left = re.compile(r"left( before its (request was read|answer was sent)|: its generation)")
    while not any(left.search(r.getMessage()) for r in caplog.records):
        assert time.monotonic() < deadline, "the server never noticed the client had left"
        time.sleep(0.05)
    reply = client.completions.create(model=MODEL, prompt="x", max_tokens=2, seed=0)
    assert reply.choices[0].finish_reason in {"stop", "length"}  # the server goes on
    assert "Traceback" not in capfd.readouterr().err
