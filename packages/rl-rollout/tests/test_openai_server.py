"""The rollout server's OpenAI-compatible routes, driven by the official ``openai`` client.

A real HFEngine on a tiny model serves in a thread of this process; a char tokenizer with a
Hermes-style chat template (tools header, ``<|role|>content<eos>`` per message) renders the
chats. Every answer is compared with the engine's own ``generate`` on the same prompt ids and
sampling parameters: the engine serving the routes is the same object, running the same
kernels on the same inputs, so ids and log-probs are compared bit for bit (the log-probs cross
the wire as JSON doubles, which hold a float32 exactly).
"""

from __future__ import annotations

import http.client
import json
import socket
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
import torch
from rl_rollout import (
    HFEngine,
    OpenAIRoutes,
    RemoteEngine,
    RolloutServer,
    RolloutServerError,
    SamplingParams,
    TraceCall,
    TraceRecorder,
    trace_rows,
)
from rl_rollout.openai_tools import hermes_tool_calls
from rl_testing.serving import raised_by
from rl_testing.tokenizer import DEFAULT_ALPHABET, char_tokenizer
from rollout_testlib import EOS, tiny

MODEL = "tiny-policy"
MAX_MODEL_LEN = 256
#: A hang guard for calls that must fail within their own few-second timeout, not a speed limit.
HANG_GUARD_S = 120.0
HERMES_TEMPLATE = (
    "{%- if tools -%}{{ '<|system|>tools:' }}{%- for t in tools -%}{{ '\\n' + (t | tojson) }}"
    "{%- endfor -%}{{ '<eos>' }}{%- endif -%}"
    "{%- for m in messages -%}{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[HFEngine, RolloutServer]]:
    tok = char_tokenizer(DEFAULT_ALPHABET + string.ascii_uppercase + '<>{}[]"_')
    tok.chat_template = HERMES_TEMPLATE
    model, tok = tiny("qwen2", seed=3, tokenizer=tok)
    engine = HFEngine(model, tok, max_model_len=MAX_MODEL_LEN)
    with RolloutServer(engine, model_name=MODEL) as server:
        yield engine, server


@pytest.fixture
def client(served: tuple[HFEngine, RolloutServer]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[1].url}/v1", api_key="unused", max_retries=0,
                         timeout=120.0)  # fmt: skip


def render(engine: HFEngine, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    """The tokenizer's own chat-template rendering, as token ids."""
    ids = engine.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
    return [int(t) for t in ids]


def ids_of(engine: HFEngine, text: str) -> list[int]:
    return list(engine.tokenizer(text, add_special_tokens=False)["input_ids"])


def expected(
    engine: HFEngine, prompts: list[list[int]], **kw: Any
) -> list[tuple[list[int], torch.Tensor, str, str]]:
    """Per row of the engine's own ``generate``: (ids, float32 log-probs, text, finish)."""
    result = engine.generate(prompts, SamplingParams(return_logprobs=True, **kw))
    assert result.logprobs is not None
    out = []
    for r, length in enumerate(result.completion_lengths.tolist()):
        out.append((
            result.completion_ids[r, :length].tolist(), result.logprobs[r, :length],
            result.texts[r], result.finish_reasons[r],
        ))  # fmt: skip
    return out


def post(url: str, path: str, body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A plain HTTP POST (no OpenAI client): status and JSON body."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def allowed(engine: HFEngine, chars: str) -> list[int]:
    """EOS and the ids of ``chars``: a small support, so EOS and stop strings come early."""
    return [EOS, *ids_of(engine, chars)]


# --------------------------------------------------------------------------- the official client


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]


def test_chat_completions_equal_the_engine(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, _ = served
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3=?"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, n=3, logprobs=True, max_tokens=6, seed=7,
        temperature=0.9, top_p=0.95, extra_body={"top_k": 20},
    )  # fmt: skip
    prompt = render(engine, messages, add_generation_prompt=True)
    assert reply.prompt_token_ids == prompt
    want = expected(engine, [prompt], temperature=0.9, top_p=0.95, top_k=20, max_new_tokens=6,
                    n=3, seed=7)  # fmt: skip
    assert len(reply.choices) == 3
    for choice, (ids, logprobs, text, finish) in zip(reply.choices, want, strict=True):
        assert choice.token_ids == ids
        assert choice.logprobs is not None and choice.logprobs.content is not None
        got = torch.tensor([c.logprob for c in choice.logprobs.content], dtype=torch.float32)
        # bit-exact: the same engine object runs the same kernels on the same prompt ids and
        # seed; float32 -> JSON double -> float32 round-trips exactly
        assert torch.equal(got, logprobs)
        assert choice.message.content == text
        assert choice.finish_reason == finish
        assert [c.token for c in choice.logprobs.content] == [
            engine.tokenizer.decode([t]) for t in ids
        ]
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == sum(len(w[0]) for w in want)


def test_completions_with_logprobs_n_and_stop_equal_the_engine(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, _ = served
    support = allowed(engine, "abc")
    reply = client.completions.create(
        model=MODEL, prompt=["1+1=", "what is 2+3?"], n=2, logprobs=1, max_tokens=8, seed=4,
        stop=["b"], extra_body={"allowed_token_ids": support},
    )  # fmt: skip
    mask = torch.zeros(engine.model.config.vocab_size, dtype=torch.bool)
    mask[support] = True
    prompts = [ids_of(engine, "1+1="), ids_of(engine, "what is 2+3?")]
    want = expected(engine, prompts, max_new_tokens=8, n=2, seed=4, stop=("b",), logit_mask=mask)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]  # prompt-major, n per prompt
    for choice, (ids, logprobs, text, finish) in zip(reply.choices, want, strict=True):
        assert choice.token_ids == ids
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        got = torch.tensor(choice.logprobs.token_logprobs, dtype=torch.float32)
        # bit-exact: same engine, same prompt ids, same seed (see the module docstring)
        assert torch.equal(got, logprobs)
        assert choice.text == text
        assert "b" not in choice.text  # the stop string is cut from the text ...
        assert choice.finish_reason == finish
    stopped = [c for c in reply.choices if c.token_ids[-1] == ids_of(engine, "b")[0]]
    assert stopped, "no choice ended at the stop string; pick another seed"
    assert all(c.finish_reason == "stop" for c in stopped)  # ... and its token is kept


def test_tools_in_the_request_are_rendered_by_the_template(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, _ = served
    messages = [{"role": "user", "content": "add 2 and 3"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[TOOL],
        max_tokens=2,
        seed=0,
    )
    prompt = render(engine, messages, tools=[TOOL], add_generation_prompt=True)
    assert reply.prompt_token_ids == prompt
    assert engine.tokenizer.decode(prompt).startswith('<|system|>tools:\n{"type": "function"')


def test_a_tool_parser_turns_the_reply_into_tool_calls(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, server = served
    seen: list[str] = []

    def parser(text: str) -> tuple[str, list[dict[str, Any]]]:
        seen.append(text)
        return "thinking", [{"name": "add", "arguments": {"a": 2}}]

    messages = [{"role": "user", "content": "add 2"}]
    server.openai.tool_parser = parser
    try:
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[TOOL], max_tokens=3, seed=2
        )
        plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, seed=2)
    finally:
        server.openai.tool_parser = None
    message = reply.choices[0].message
    assert message.content == "thinking"
    assert message.tool_calls is not None
    [call] = message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "add", {"a": 2},
    )  # fmt: skip
    assert reply.choices[0].finish_reason in {"tool_calls", "length"}
    assert plain.choices[0].message.tool_calls is None
    prompt = render(engine, messages, tools=[TOOL], add_generation_prompt=True)
    [(ids, _, text, _)] = expected(engine, [prompt], max_new_tokens=3, seed=2)
    assert reply.choices[0].token_ids == ids  # the sampled ids are what they were
    assert seen == [text]  # parsed once, the reply's text: only the request with tools


def test_hermes_tool_calls() -> None:
    text = 'sure <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert hermes_tool_calls(text) == ("sure", [{"name": "add", "arguments": {"a": 1}}])
    assert hermes_tool_calls("no call") == ("no call", [])
    broken = "<tool_call>{not json}</tool_call>"
    assert hermes_tool_calls(broken) == (broken, [])  # not a call: the agent sees the text
    with pytest.raises(ValueError, match="`tool_parser` 'nope' is unknown"):
        OpenAIRoutes(HFEngine(*tiny("qwen2")), tool_parser="nope")


# --------------------------------------------------------------------------- the token route


def test_token_route_answers_what_verifiers_train_client_reads(
    served: tuple[HFEngine, RolloutServer],
) -> None:
    engine, server = served
    prompt = render(engine, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    status, body = post(server.url, "/inference/v1/generate", {
        "model": MODEL, "token_ids": prompt,
        "sampling_params": {"max_tokens": 5, "temperature": 0.8, "top_k": -1, "seed": 9,
                            "logprobs": 1, "skip_special_tokens": True, "n": 1},
    })  # fmt: skip
    assert status == 200, body
    [choice] = body["choices"]
    [(ids, logprobs, _, finish)] = expected(engine, [prompt], max_new_tokens=5, temperature=0.8,
                                            seed=9)  # fmt: skip
    assert choice["token_ids"] == ids
    # bit-exact: same engine, same prompt ids, same seed (see the module docstring)
    got = [c["logprob"] for c in choice["logprobs"]["content"]]
    assert torch.equal(torch.tensor(got, dtype=torch.float32), logprobs)
    assert choice["finish_reason"] == finish
    assert isinstance(body["request_id"], str)


# --------------------------------------------------------------------------- the trace recorder


def test_trace_rows_single_turn_are_the_engines_and_the_templates_ids(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, server = served
    messages = [{"role": "user", "content": "count: 1 2 3"}]
    support = allowed(engine, "0123 ")
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, n=2, max_tokens=7, seed=1,
        extra_headers={"X-Episode-Id": "single"}, extra_body={"allowed_token_ids": support},
    )  # fmt: skip
    mask = torch.zeros(engine.model.config.vocab_size, dtype=torch.bool)
    mask[support] = True
    prompt = render(engine, messages, add_generation_prompt=True)
    want = expected(engine, [prompt], max_new_tokens=7, n=2, seed=1, logit_mask=mask)
    rows = server.traces.rows("single")
    assert len(rows) == 2
    for k, (row, (ids, logprobs, text, _)) in enumerate(zip(rows, want, strict=True)):
        # bit-exact: integer ids, never re-tokenised
        assert row.prompt_ids == prompt
        assert row.completion_ids == ids == reply.choices[k].token_ids
        assert row.sampled_mask == [True] * len(ids)
        # bit-exact: the log-probs the engine sampled with (same engine, inputs and seed)
        assert torch.equal(torch.tensor(row.logprobs, dtype=torch.float32), logprobs)
        assert row.calls == [(0, k)]
        # the template renders the reply back to the sampled ids (+ its <eos> if cut by length)
        full = render(engine, [*messages, {"role": "assistant", "content": text}])
        assert full == row.token_ids + ([] if ids[-1] == EOS else [EOS])
    server.traces.pop("single")


def test_trace_rows_multi_turn_merge_into_one_row_equal_to_the_template(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    engine, server = served
    support = allowed(engine, "ab")
    mask = torch.zeros(engine.model.config.vocab_size, dtype=torch.bool)
    mask[support] = True
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "seed": 5, "user": "multi",
                          "extra_body": {"allowed_token_ids": support}}  # fmt: skip
    turn1 = [{"role": "user", "content": "say ab"}]
    reply1 = client.chat.completions.create(messages=turn1, **kw)
    text1 = reply1.choices[0].message.content
    assert text1 is not None
    turn2 = [*turn1, {"role": "assistant", "content": text1}, {"role": "tool", "content": "ok"}]
    reply2 = client.chat.completions.create(messages=turn2, **kw)
    p1, p2 = (render(engine, m, add_generation_prompt=True) for m in (turn1, turn2))
    [(c1, lp1, _, _)] = expected(engine, [p1], max_new_tokens=6, seed=5, logit_mask=mask)
    [(c2, lp2, text2, _)] = expected(engine, [p2], max_new_tokens=6, seed=5, logit_mask=mask)
    # bit-exact: integer ids; the server's prompts are the template's own rendering
    assert reply1.prompt_token_ids == p1
    assert reply2.prompt_token_ids == p2
    assert reply1.choices[0].token_ids == c1
    assert reply2.choices[0].token_ids == c2

    calls = RemoteEngine(server.url, timeout=60.0).pop_trace("multi")
    assert [c.route for c in calls] == ["chat", "chat"]
    assert server.traces.calls("multi") == []  # popped
    [row] = trace_rows(calls)
    assert row.prompt_ids == p1
    assert row.token_ids == p2 + c2  # turn 2's prompt extends turn 1's prompt + completion
    gap = len(p2) - len(p1) - len(c1)
    assert row.sampled_mask == [True] * len(c1) + [False] * gap + [True] * len(c2)
    assert row.completion_ids[: len(c1)] == c1
    # bit-exact: the engine's log-probs at the model's tokens, 0 on the tool's and template's
    want = torch.cat([lp1, torch.zeros(gap), lp2])
    assert torch.equal(torch.tensor(row.logprobs, dtype=torch.float32), want)
    assert row.calls == [(0, 0), (1, 0)]
    full = render(engine, [*turn2, {"role": "assistant", "content": text2}])
    assert full == row.token_ids + ([] if c2[-1] == EOS else [EOS])


def test_concurrent_episodes_are_recorded_apart(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    """Agents running in parallel: each episode's rows hold its own calls only."""
    engine, server = served
    episodes = [f"parallel-{i}" for i in range(4)]

    def episode(name: str) -> list[int]:
        messages = [{"role": "user", "content": name}]
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=3, seed=0, user=name
        )
        return render(engine, messages, add_generation_prompt=True) + reply.choices[0].token_ids

    with ThreadPoolExecutor(max_workers=4) as pool:
        sequences = list(pool.map(episode, episodes))
    for name, sequence in zip(episodes, sequences, strict=True):
        [row] = server.traces.rows(name)
        assert row.token_ids == sequence  # bit-exact: integer ids
        server.traces.pop(name)


# --------------------------------------------------------------------------- bad input


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict)
    return dict(body.get("error", body))  # the client unwraps {"error": {...}}


@pytest.mark.parametrize(
    ("kwargs", "status", "param", "match"),
    [
        ({"model": "gpt-4o"}, 404, "model", "'gpt-4o' is not served here"),
        ({"n": 0}, 400, "n", "`n` must be >= 1"),
        ({"messages": [{"role": "user", "content": "x" * MAX_MODEL_LEN}]}, 400, "messages",
         "leaves no room to generate within the engine's max_model_len = 256"),
        ({"max_tokens": MAX_MODEL_LEN}, 400, "max_tokens", "ask for at most"),
        ({"top_logprobs": 2, "logprobs": True}, 400, "top_logprobs", "sampled token only"),
        ({"temperature": -1.0}, 400, "temperature", "`temperature` must be >= 0"),
        ({"seed": 2**64}, 400, "seed", "`seed` must be an int in [-2**63, 2**64)"),
        ({"messages": [{"content": "no role"}]}, 400, "messages[0]", "string `role`"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         400, "messages[0].content", "only text parts are supported"),
        ({"extra_body": {"chat_template_kwargs": [1]}}, 400, "chat_template_kwargs", "object"),
        ({"extra_body": {"chat_template_kwargs": {"tokenize": False}}}, 400,
         "chat_template_kwargs", "`chat_template_kwargs` sets 'tokenize', which the server "),
        ({"frequency_penalty": 0.5}, 400, "frequency_penalty", "use `repetition_penalty`"),
        # accepted and ignored before: refused by name
        ({"response_format": {"type": "json_object"}}, 400, "response_format",
         "`response_format` is not supported"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, 400, "guided_json",
         "`guided_json` is not supported"),
        ({"extra_body": {"ignore_eos": True}}, 400, "ignore_eos", "`ignore_eos` = True is not"),
        ({"tools": [TOOL], "parallel_tool_calls": False}, 400, "parallel_tool_calls",
         "`parallel_tool_calls` = False is not supported"),
        ({"tools": [TOOL], "tool_choice": "required"}, 400, "tool_choice",
         "does not constrain decoding"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         400, "tool_choice", "names the tool 'nope', which is not in `tools` (['add'])"),
        ({"tool_choice": "required"}, 400, "tool_choice", "needs `tools` (the request has none)"),
        ({"tools": [{"type": "function"}]}, 400, "tools[0]", "`tools[0]` must be"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, 400,
         "tools[0].function.parameters", "a JSON Schema object"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
         "messages[0].content[0].text", "must be a string"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content",
         "a string or a list of text parts"),
        ({"max_tokens": openai.omit, "max_completion_tokens": 0}, 400, "max_completion_tokens",
         "`max_completion_tokens` must be >= 1"),
        ({"max_tokens": openai.omit, "max_completion_tokens": "3"}, 400,
         "max_completion_tokens", "`max_completion_tokens` must be an int"),
        ({"max_tokens": openai.omit, "max_completion_tokens": MAX_MODEL_LEN}, 400,
         "max_completion_tokens", "ask for at most"),
        ({"max_completion_tokens": 3}, 400, "max_completion_tokens", "pass one of"),
    ],
)  # fmt: skip
def test_bad_chat_requests_are_4xx_naming_the_field(
    client: openai.OpenAI,
    kwargs: dict[str, Any],
    status: int,
    param: str,
    match: str,
) -> None:
    request: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 2, **kwargs}  # fmt: skip
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**request)
    assert info.value.status_code == status
    error = _error(info.value)
    assert error["param"] == param, error
    assert match in error["message"], error


def test_fields_that_change_nothing_are_accepted(
    served: tuple[HFEngine, RolloutServer], client: openai.OpenAI
) -> None:
    """Bookkeeping fields and the default value of a behaviour field sample as without them."""
    engine, _ = served
    messages = [{"role": "user", "content": "hi"}]
    kw: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 3, "seed": 6}
    plain = client.chat.completions.create(**kw)
    reply = client.chat.completions.create(
        **kw, tools=[TOOL], tool_choice="none", parallel_tool_calls=True, metadata={"a": "b"},
        store=False, extra_body={"ignore_eos": False, "skip_special_tokens": True},
    )  # fmt: skip
    assert reply.choices[0].token_ids == plain.choices[0].token_ids  # bit-exact: integer ids
    auto = client.chat.completions.create(**{**kw, "tools": [TOOL], "tool_choice": "auto"})
    prompt = render(engine, messages, tools=[TOOL], add_generation_prompt=True)
    assert auto.prompt_token_ids == prompt


def test_models_retrieve_answers_the_served_model(client: openai.OpenAI) -> None:
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    error = _error(info.value)
    assert error["param"] == "model", error
    assert "'gpt-4o' is not served here" in error["message"], error


def test_malformed_bodies_are_400_naming_the_field(served: tuple[HFEngine, RolloutServer]) -> None:
    _, server = served
    cases: list[tuple[str, bytes | dict[str, Any], str]] = [
        ("/v1/chat/completions", b"{not json", "body"),
        ("/v1/chat/completions", b"[1, 2]", "body"),
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 5}, "logprobs"),
        ("/inference/v1/generate", {"token_ids": [5], "stream": True}, "stream"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {}},
         "stream_options"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True,
         "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True,
         "stream_options": {"continuous_usage_stats": True}},
         "stream_options.continuous_usage_stats"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": True,
         "stream_options": {"chunk_size": 1}}, "stream_options.chunk_size"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "3"}, "max_tokens"),
        ("/inference/v1/generate", {"model": MODEL}, "token_ids"),
        ("/inference/v1/generate", {"token_ids": [1, -2]}, "token_ids"),
        ("/inference/v1/generate", {"token_ids": [5], "sampling_params": {"n": 0}},
         "sampling_params.n"),
        ("/inference/v1/generate", {"token_ids": [5], "sampling_params": {"temprature": 1}},
         "sampling_params.temprature"),
        ("/inference/v1/generate", {"token_ids": [5] * MAX_MODEL_LEN}, "token_ids"),
        # accepted and ignored before: refused by name
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "foo": 1}, "foo"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "no"}, "stream"),
        ("/inference/v1/generate", {"token_ids": [5], "foo": 1}, "foo"),
        ("/inference/v1/generate", {"token_ids": [5], "sampling_params": {"max_tokens": 2,
         "logprobs": 5}}, "sampling_params.logprobs"),
    ]  # fmt: skip
    for path, body, param in cases:
        status, answer = post(server.url, path, body)
        assert status == 400, (path, body, answer)
        assert answer["error"]["param"] == param, (path, body, answer)
        assert answer["error"]["type"] == "invalid_request_error"


def test_a_down_server_fails_within_the_timeout_naming_the_url() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3.0)
    messages = [{"role": "user", "content": "x"}]
    error = raised_by(
        lambda: client.chat.completions.create(model=MODEL, messages=messages), HANG_GUARD_S
    )
    assert isinstance(error, openai.APIConnectionError), repr(error)
    assert str(error.request.url).startswith(url)
    error = raised_by(lambda: RemoteEngine(url, connect_timeout=3.0).pop_trace("any"), HANG_GUARD_S)
    assert isinstance(error, RolloutServerError), repr(error)
    assert f"cannot reach the rollout server at {url}" in str(error)


def test_a_silent_server_times_out_naming_the_url() -> None:
    """Accepts the connection and never answers: the client's 1 s read timeout fires."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1.0)
    try:
        error = raised_by(lambda: client.completions.create(model=MODEL, prompt="x"), HANG_GUARD_S)
        assert isinstance(error, openai.APITimeoutError), repr(error)
        assert str(error.request.url) == f"{url}/v1/completions"
    finally:
        listener.close()


# --------------------------------------------------------------------------- trace_rows alone


def test_trace_rows_fork_with_n_and_start_over_on_a_rewritten_history() -> None:
    calls = [
        TraceCall("chat", (1, 2), ((3, 4), (5,)), ((-0.5, -0.25), (-1.0,)), ("stop", "length")),
        # extends choice 0 of call 0 by the tokens (6,) that are not the model's
        TraceCall("chat", (1, 2, 3, 4, 6), ((7,),), ((-2.0,),), ("stop",)),
        # matches no earlier row (a rewritten history): a row of its own
        TraceCall("completions", (9, 9), ((8,),), ((-3.0,),), ("length",)),
    ]
    rows = trace_rows(calls)
    assert [(r.prompt_ids, r.completion_ids, r.sampled_mask, r.logprobs, r.calls) for r in rows] == [
        ([1, 2], [5], [True], [-1.0], [(0, 1)]),
        ([1, 2], [3, 4, 6, 7], [True, True, False, True], [-0.5, -0.25, 0.0, -2.0],
         [(0, 0), (1, 0)]),
        ([9, 9], [8], [True], [-3.0], [(2, 0)]),
    ]  # fmt: skip
    assert [r.finish_reason for r in rows] == ["length", "stop", "length"]
    assert rows[1].turns == 2
    assert TraceCall.from_json(calls[0].to_json()) == calls[0]
    recorder = TraceRecorder()
    for call in calls:
        recorder.record("e", call)
    assert recorder.episodes() == ["e"]
    assert recorder.rows("e") == rows
    assert recorder.pop("e") == calls
    assert recorder.calls("e") == []


def test_trace_call_checks_its_lengths() -> None:
    with pytest.raises(ValueError, match="`completion_ids` has 1 choices but `logprobs` has 0"):
        TraceCall("chat", (1,), ((2,),), (), ("stop",))
    with pytest.raises(ValueError, match="choice 0: `completion_ids` has 2 tokens"):
        TraceCall("chat", (1,), ((2, 3),), ((-1.0,),), ("stop",))
