"""Server mode: any :class:`~rl_rollout.Engine` behind a small HTTP API, and its client.

The trainer talks to a rollout server (a vLLM engine on its own GPUs, or an ``HFEngine``
anywhere) through :class:`RemoteEngine`, which implements the same :class:`~rl_rollout.Engine`
interface, so rl-algos does not know the difference. Every call has a connect timeout and a
deadline for the rest of the call and fails with a :class:`RolloutServerError` naming the URL,
the call and what to do, instead of hanging (the most common complaint about peers' weight
sync).

Endpoints (JSON unless noted; no pickle anywhere):

- ``GET /health`` -> ``{"status": "ok", "engine": <class name>, "record_routes": bool}``
- ``POST /generate`` ``{"prompts": [[ids...]] | [str], "params": {...}}`` -> the result (with
  ``--record-routes``, a mixture-of-experts model's routes as a base64 safetensors payload)
- ``POST /update_weights`` (body: safetensors bytes) -> ``{"updated": <count>}``
- ``POST /load_lora`` ``{"name": str, "path": str}`` (a peft adapter directory the server can
  read, e.g. on a shared filesystem)
- ``POST /load_adapter`` (body: a LoRA adapter as safetensors bytes, name, version and peft
  config in its metadata: :func:`rl_rollout.lora_sync.adapter_to_bytes`) -> ``{"loaded": name,
  "version": int, "bytes": int}``: adapter-only sync, in memory, no shared directory; each
  ``/generate`` answer then carries ``weight_version``
- ``POST /sleep`` ``{"level": int}``, ``POST /wake_up`` ``{"tags": [str] | null}``
- ``POST /traces/pop`` ``{"episode_id": str}`` -> ``{"calls": [...]}`` (the recorded calls of
  an episode, removed from the server; :meth:`RemoteEngine.pop_trace`)

and the OpenAI-compatible routes of :mod:`rl_rollout.openai_api`: ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions`` and the token route
``POST /inference/v1/generate``, which answer with the token ids and sampling log-probs of
what was sampled and record each call of an episode (``X-Episode-Id`` header or ``user``) in
:attr:`RolloutServer.traces`, from which :mod:`rl_rollout.openai_trace` builds training rows.

A generation whose client closes its connection before the answer stops before its next
token, and a request still queued when its client leaves never starts
(:mod:`rl_rollout.cancel`, ``cancel_on_disconnect``).

Start one with ``rl-rollout-server --engine vllm --model PATH --port 8000``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import torch
from safetensors.torch import load as load_safetensors

from rl_rollout._arrival import ArrivalOrderLock
from rl_rollout._disconnect import ClientWatch
from rl_rollout._wire import (
    params_from_json,
    result_to_json,
)
from rl_rollout.cancel import GenerationCancelledError, cancelled_when, raise_if_cancelled
from rl_rollout.engine import Engine
from rl_rollout.lora_sync import adapter_from_bytes
from rl_rollout.openai_api import OpenAIError, OpenAIRoutes
from rl_rollout.openai_stream import StreamedResponse
from rl_rollout.openai_tools import TOOL_PARSERS, ToolParser
from rl_rollout.openai_trace import TraceRecorder
from rl_rollout.remote import _CLIENT_ERRORS, RemoteEngine, RolloutServerError

__all__ = ["RemoteEngine", "RolloutServer", "RolloutServerError", "main"]

_LOG = logging.getLogger(__name__)
_MAX_BODY = 64 * 1024**3  # refuse absurd Content-Length values outright


class _NoRouteError(Exception):
    """An unknown endpoint."""


class RolloutServer:
    """Serve ``engine`` over HTTP on ``host:port`` (``port=0`` picks a free port).

    Requests are served one at a time (a lock around the engine): generation and weight sync
    never interleave. The OpenAI-compatible routes (:class:`~rl_rollout.openai_api.OpenAIRoutes`)
    serve the same engine, so they sample with the current policy's weights.

    Args:
        engine: The engine to serve.
        host: Interface to bind.
        port: TCP port; 0 picks a free one (see :attr:`url`).
        tokenizer: The tokenizer of the OpenAI routes (chat template, decoding); default
            ``engine.tokenizer`` (HFEngine and VLLMEngine have one).
        model_name: The model name the OpenAI routes accept and report.
        traces: Where the OpenAI routes record the calls of each episode (default: a new
            :class:`~rl_rollout.openai_trace.TraceRecorder`, :attr:`traces`).
        tool_parser: How the chat route reads tool calls out of a reply (``"hermes"`` or a
            callable, see :mod:`rl_rollout.openai_tools`); None answers with text only.
        cancel_on_disconnect: Stop a generation whose client closed its connection, at its
            next token, and skip a queued one (:mod:`rl_rollout.cancel`; HFEngine stops within a
            token, other engines only while queued). Counted in :attr:`disconnects` and
            :attr:`cancelled`, one ``INFO`` line each.
    """

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tokenizer: Any = None,
        model_name: str = "policy",
        traces: TraceRecorder | None = None,
        tool_parser: ToolParser | str | None = None,
        cancel_on_disconnect: bool = True,
    ) -> None:
        self.engine = engine
        self.cancel_on_disconnect = cancel_on_disconnect
        self.disconnects = 0
        """Requests whose client closed its connection before the answer (watched ones)."""
        self.cancelled = 0
        """Generations stopped (or never started) because their client left."""
        self._counts = threading.Lock()
        self.openai = OpenAIRoutes(
            engine, tokenizer, model_name=model_name, traces=traces, tool_parser=tool_parser
        )
        self.traces = self.openai.traces
        self._lock = ArrivalOrderLock()  # requests reach the engine in arrival order
        self._thread: threading.Thread | None = None
        self._served = False  # whether a serve_forever loop was started (close() stops it)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the trainer's logs are the place for progress."""

            def handle(self) -> None:
                """A client that leaves mid-request is one log line, not a traceback."""
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError) as exc:
                    _LOG.info("a client left before its request was read (%s)", type(exc).__name__)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._reply(200, server.openai.models())
                    return
                if self.path.startswith("/v1/"):  # OpenAI's routes answer OpenAI's bodies
                    try:
                        if not self.path.startswith("/v1/models/"):
                            raise OpenAIError(f"no route GET {self.path}", status=404)
                        model_id = unquote(self.path.removeprefix("/v1/models/"))
                        self._reply(200, server.openai.model(model_id))
                    except OpenAIError as exc:
                        self._reply(exc.status, exc.to_json())
                    return
                if self.path != "/health":
                    self._reply(404, {"error": "NotFound", "message": f"no route {self.path}"})
                    return
                self._reply(200, server.health())

            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    if length < 0 or length > _MAX_BODY:
                        raise ValueError(f"Content-Length {length} is out of range")
                    body = self.rfile.read(length)
                    if len(body) < length:  # the client stopped sending: never parse a part
                        raise ValueError(
                            f"the request body ended after {len(body)} of its {length} bytes "
                            "(Content-Length): the upload was cut off; send it again"
                        )
                    watch = ClientWatch(
                        self.connection,
                        on_left=server._client_left,
                        enabled=server.cancel_on_disconnect,
                    )
                    with watch, cancelled_when(watch.left):
                        if self.path.startswith(("/v1/", "/inference/")):
                            headers = dict(self.headers.items())
                            payload = server._openai(self.path, body, headers)
                        else:
                            with server._lock:
                                payload = server._dispatch(self.path, body)
                except GenerationCancelledError:
                    with server._counts:
                        server.cancelled += 1
                    _LOG.info("the client of POST %s left: its generation was cancelled", self.path)
                    self.close_connection = True
                    return
                except OpenAIError as exc:  # OpenAI's error body, `param` naming the field
                    self._reply(exc.status, exc.to_json())
                    return
                except Exception as exc:  # reported to the client, never swallowed
                    code = 400 if type(exc).__name__ in _CLIENT_ERRORS else 500
                    code = 404 if isinstance(exc, _NoRouteError) else code
                    self._reply(code, {"error": type(exc).__name__, "message": str(exc)})
                    return
                if isinstance(payload, StreamedResponse):
                    self._stream(payload)
                    return
                self._reply(200, payload)

            def _stream(self, payload: StreamedResponse) -> None:
                """Server-sent events; the connection closes after ``[DONE]`` (HTTP/1.0)."""
                headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                self._send(200, headers, payload.events())

            def _reply(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
                self._send(code, headers, [data])

            def _send(self, code: int, headers: dict[str, str], body: Iterable[bytes]) -> None:
                """Send an answer; a client that has left is logged in one line, not raised."""
                try:
                    self.send_response(code)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    for chunk in body:
                        self.wfile.write(chunk)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError) as exc:
                    self.close_connection = True
                    _LOG.info(
                        "the client of %s %s left before its answer was sent (%s)",
                        self.command, self.path, type(exc).__name__,
                    )  # fmt: skip

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True

    def health(self) -> dict[str, Any]:
        """``GET /health``: the engine's class, and whether its results carry routes.

        ``record_routes``: the engine records the experts a mixture-of-experts model routes
        each token to (``HFEngine(record_routes=True)``, ``--record-routes``).
        """
        return {
            "status": "ok",
            "engine": type(self.engine).__name__,
            "record_routes": bool(getattr(self.engine, "record_routes", False)),
        }

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def _client_left(self) -> None:
        with self._counts:
            self.disconnects += 1

    def _openai(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> dict[str, Any] | StreamedResponse:
        headers = {k.lower(): v for k, v in headers.items()}
        try:
            with self._lock:
                raise_if_cancelled()  # its client left while it waited
                return self.openai.handle(path, body, headers)
        except (OpenAIError, GenerationCancelledError):
            raise
        except Exception as exc:  # an engine failure: OpenAI's error body, HTTP 500
            raise OpenAIError(f"{type(exc).__name__}: {exc}", status=500) from exc

    def _dispatch(self, path: str, body: bytes) -> dict[str, Any]:  # noqa: PLR0911
        if path == "/update_weights":
            try:
                tensors = load_safetensors(body)
            except Exception as exc:  # safetensors' own error type: a bad request, not a crash
                raise ValueError(
                    f"the body of /update_weights is not a safetensors payload ({exc}); send "
                    "it with RemoteEngine.update_weights"
                ) from exc
            self.engine.update_weights(tensors.items())
            return {"updated": len(tensors)}
        if path == "/load_adapter":
            adapter = adapter_from_bytes(body)
            self.engine.load_adapter(adapter.name, adapter.tensors, adapter.config, adapter.version)
            return {"loaded": adapter.name, "version": adapter.version, "bytes": len(body)}
        try:
            request = json.loads(body or b"{}")
        except ValueError as exc:
            raise ValueError(f"the body of {path} is not valid JSON ({exc})") from exc
        if not isinstance(request, dict):
            raise ValueError(f"the body of {path} must be a JSON object")

        def required(key: str) -> Any:
            if key not in request:
                raise ValueError(f"`{key}` is required in the body of {path}")
            return request[key]

        if path == "/generate":
            params = params_from_json(request.get("params", {}))
            prompts = required("prompts")
            raise_if_cancelled()  # its client left while it waited
            result = self.engine.generate(prompts, params)
            return result_to_json(result)
        if path == "/load_lora":
            self.engine.load_lora(str(required("name")), str(required("path")))
            return {"loaded": request["name"]}
        if path == "/sleep":
            level = request.get("level", 1)
            if not isinstance(level, int) or isinstance(level, bool):
                raise ValueError(f"`level` must be an int (1 or 2), got {level!r}")
            self.engine.sleep(level)
            return {"sleeping": True}
        if path == "/wake_up":
            self.engine.wake_up(request.get("tags"))
            return {"sleeping": False}
        if path == "/traces/pop":
            calls = self.traces.pop(str(required("episode_id")))
            return {"calls": [call.to_json() for call in calls]}
        raise _NoRouteError(f"no route {path}")

    def start(self) -> RolloutServer:
        """Serve in a background daemon thread; returns ``self``."""
        self._served = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (or :meth:`close` from another thread)."""
        self._served = True
        self._httpd.serve_forever()

    def close(self) -> None:
        """Stop serving and release the port (also for a server never started, and again)."""
        if self._served:  # shutdown() waits for a serve_forever loop: one that never ran hangs
            self._httpd.shutdown()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> RolloutServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _build_engine(args: argparse.Namespace) -> Engine:
    if args.engine == "vllm":
        from rl_rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            args.model,
            tokenizer=args.tokenizer,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.max_num_seqs,
            tensor_parallel_size=args.tensor_parallel_size,
            enable_lora=args.enable_lora,
            max_lora_rank=args.max_lora_rank,
            dtype=args.dtype,
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_rollout.engine import HFEngine

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto")
    if torch.cuda.is_available():
        model.to(torch.device("cuda"))  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    return HFEngine(
        model, tokenizer, max_model_len=args.max_model_len, record_routes=args.record_routes
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``rl-rollout-server`` (or ``python -m rl_rollout``): serve an engine until interrupted."""
    parser = argparse.ArgumentParser(
        prog="rl-rollout-server",
        description="Serve a generation engine over HTTP for RemoteEngine clients.",
    )
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--model", required=True, help="model directory or hub id")
    parser.add_argument("--tokenizer", default=None, help="tokenizer path (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the model name of the OpenAI-compatible routes (default: --model)",
    )
    parser.add_argument(
        "--tool-parser",
        choices=sorted(TOOL_PARSERS),
        default=None,
        help="read tool calls out of chat replies into message.tool_calls",
    )
    parser.add_argument(
        "--no-cancel-on-disconnect",
        action="store_true",
        help="sample every request to its end even when its client has left",
    )
    parser.add_argument(
        "--record-routes",
        action="store_true",
        help="return the experts a mixture-of-experts model routes each token to while "
        "sampling (--engine hf; for a trainer's router_replay='R3')",
    )
    args = parser.parse_args(argv)
    if args.record_routes and args.engine != "hf":
        parser.error("--record-routes needs --engine hf (the vLLM engine returns no routes)")
    name = args.served_model_name or args.model
    server = RolloutServer(
        _build_engine(args),
        args.host,
        args.port,
        model_name=name,
        tool_parser=args.tool_parser,
        cancel_on_disconnect=not args.no_cancel_on_disconnect,
    )
    print(f"rl-rollout server ({args.engine}) on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
