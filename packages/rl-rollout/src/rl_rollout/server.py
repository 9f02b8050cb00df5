"""Server mode: any :class:`~rl_rollout.Engine` behind a small HTTP API, and its client.

The trainer talks to a rollout server (a vLLM engine on its own GPUs, or an ``HFEngine``
anywhere) through :class:`RemoteEngine`, which implements the same :class:`~rl_rollout.Engine`
interface, so rl-algos does not know the difference. Every call has a connect timeout and a
deadline for the rest of the call and fails with a :class:`RolloutServerError` naming the URL,
the call and what to do, instead of hanging (the most common complaint about peers' weight
sync).

Endpoints (JSON unless noted; no pickle anywhere):

- ``GET /health`` -> ``{"status": "ok", "engine": <class name>}``
- ``POST /generate`` ``{"prompts": [[ids...]] | [str], "params": {...}}`` -> the result
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

Start one with ``rl-rollout-server --engine vllm --model PATH --port 8000``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rl_rollout._arrival import ArrivalOrderLock
from rl_rollout._http import exchange
from rl_rollout._prompts import Prompts
from rl_rollout._wire import (
    params_from_json,
    params_to_json,
    prompts_to_json,
    result_from_json,
    result_to_json,
)
from rl_rollout.engine import Engine
from rl_rollout.lora_sync import LoraAdapter, adapter_from_bytes, adapter_to_bytes
from rl_rollout.openai_api import OpenAIError, OpenAIRoutes
from rl_rollout.openai_stream import StreamedResponse
from rl_rollout.openai_tools import TOOL_PARSERS, ToolParser
from rl_rollout.openai_trace import TraceCall, TraceRecorder
from rl_rollout.params import SamplingParams
from rl_rollout.result import RolloutResult

__all__ = ["RemoteEngine", "RolloutServer", "RolloutServerError", "main"]

_MAX_BODY = 64 * 1024**3  # refuse absurd Content-Length values outright
# what a rejected request raises on the client: the server's exception name -> client type
_CLIENT_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "KeyError": ValueError,
    "NotImplementedError": NotImplementedError,
}


class RolloutServerError(RuntimeError):
    """A rollout server could not be reached, did not answer in time, or failed."""


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
    ) -> None:
        self.engine = engine
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
                self._reply(200, {"status": "ok", "engine": type(server.engine).__name__})

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
                    if self.path.startswith(("/v1/", "/inference/")):
                        payload = server._openai(self.path, body, dict(self.headers.items()))
                    else:
                        with server._lock:
                            payload = server._dispatch(self.path, body)
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
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for event in payload.events():
                    self.wfile.write(event)
                self.wfile.flush()

            def _reply(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def _openai(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> dict[str, Any] | StreamedResponse:
        headers = {k.lower(): v for k, v in headers.items()}
        try:
            with self._lock:
                return self.openai.handle(path, body, headers)
        except OpenAIError:
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
            result = self.engine.generate(required("prompts"), params)
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


class RemoteEngine:
    """Client of a :class:`RolloutServer`; an :class:`~rl_rollout.Engine` like the others.

    Args:
        base_url: ``http://host:port`` of the server.
        timeout: Seconds for a whole call once connected (sending the request, generation,
            reading the reply) before failing: a deadline, however slowly the reply comes.
        connect_timeout: Seconds to wait for the TCP connection.
        weight_sync_timeout: Seconds for ``update_weights`` / ``load_lora`` /
            ``load_adapter`` / ``sleep`` / ``wake_up`` (default: ``timeout``), each try.
        sync_retries: Further tries of a ``load_adapter`` that found the server down or silent
            (a refused adapter is not retried), after 0.5 s, 1 s, ...
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        weight_sync_timeout: float | None = None,
        sync_retries: int = 2,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"`base_url` must look like 'http://host:port', got {base_url!r}")
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not value > 0:
                raise ValueError(f"`{name}` must be > 0 seconds, got {value}")
        self.base_url = base_url.rstrip("/")
        self._host, self._port = parts.hostname, parts.port
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.weight_sync_timeout = weight_sync_timeout or timeout
        if sync_retries < 0:
            raise ValueError(f"`sync_retries` must be >= 0, got {sync_retries}")
        self.sync_retries = sync_retries
        self.last_sync: dict[str, float] = {}
        """``bytes`` (request body), ``tensor_bytes`` and ``seconds`` of the last
        :meth:`load_adapter`."""

    def pop_trace(self, episode_id: str) -> list[TraceCall]:
        """The calls the server recorded for ``episode_id``, removed from the server.

        Build training rows with :func:`rl_rollout.openai_trace.trace_rows`.
        """
        body = json.dumps({"episode_id": episode_id}).encode()
        payload = self._request("/traces/pop", body, timeout=self.timeout)
        return [TraceCall.from_json(call) for call in payload["calls"]]

    def _request(
        self,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float,
        content_type: str = "application/json",
        setting: str = "timeout",
    ) -> dict[str, Any]:
        """One call: ``connect_timeout`` for the connection, then ``timeout`` as a deadline.

        The deadline covers sending the request and reading the whole reply, however slowly
        it comes; ``setting`` is the name of the setting ``timeout`` came from, for the errors.
        """
        url = f"{self.base_url}{path}"
        start = time.monotonic()
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)
        try:
            try:
                conn.connect()
            except TimeoutError as exc:
                raise RolloutServerError(
                    f"connecting to the rollout server at {self.base_url} timed out after "
                    f"{self.connect_timeout} s (connect_timeout); is the host reachable?"
                ) from exc
            except OSError as exc:
                raise RolloutServerError(
                    f"cannot reach the rollout server at {self.base_url} ({exc}); start it with "
                    "`rl-rollout-server --engine vllm --model PATH --port PORT` or "
                    "check `base_url`"
                ) from exc
            replied: list[bool] = []
            try:
                status, data = exchange(conn, path, body, content_type, timeout, replied)
            except TimeoutError as exc:
                if not replied:
                    raise RolloutServerError(
                        f"no reply from {url} within {timeout} s (`{setting}`); the server is "
                        "busy or stuck (a weight sync waiting on a collective, an engine out of "
                        "memory); raise the timeout for long generations or check the server's "
                        "log"
                    ) from exc
                raise RolloutServerError(
                    f"the reply from {url} did not finish within {timeout} s (`{setting}`, a "
                    "deadline for the whole call): the server sends it too slowly or stalled "
                    "mid-body; check the server and the network, or raise the timeout"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise RolloutServerError(
                    f"the rollout server at {url} dropped the connection after "
                    f"{time.monotonic() - start:.1f} s ({exc!r}); check the server's log"
                ) from exc
        finally:
            conn.close()
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise RolloutServerError(
                f"{url} answered HTTP {status} with a body that is not JSON: {data[:200]!r}"
            ) from exc
        if not isinstance(payload, dict):
            raise RolloutServerError(
                f"{url} answered HTTP {status} with JSON that is not an object: "
                f"{data[:200]!r}; is this an rl-rollout server?"
            )
        if status != 200:
            message = f"{path.lstrip('/')} failed on the server: {payload.get('message', payload)}"
            error = _CLIENT_ERRORS.get(str(payload.get("error")), RolloutServerError)
            raise error(message)
        return payload

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer (raises :class:`RolloutServerError` when down).

        The call's deadline is the smaller of ``timeout`` and ``connect_timeout``.
        """
        if self.timeout < self.connect_timeout:
            return self._request("/health", timeout=self.timeout)
        return self._request("/health", timeout=self.connect_timeout, setting="connect_timeout")

    def generate(self, prompts: Prompts, params: SamplingParams) -> RolloutResult:
        """Sample on the server; see :meth:`rl_rollout.Engine.generate`.

        Raises:
            ValueError: the server refused the prompts or the parameters (its message).
            RolloutServerError: the server is down, stuck or failed, or answered with something
                that is not a rollout result for these prompts.
        """
        body = json.dumps(
            {"prompts": prompts_to_json(prompts), "params": params_to_json(params)}
        ).encode()
        url = f"{self.base_url}/generate"
        payload = self._request("/generate", body, timeout=self.timeout)
        try:
            result = result_from_json(payload)
            rows = len(prompts) * params.n
            if result.completion_ids.shape[0] != rows:
                raise ValueError(
                    f"{result.completion_ids.shape[0]} rows for {len(prompts)} prompts x "
                    f"n = {params.n}"
                )
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise RolloutServerError(
                f"{url} answered a body that is not a rollout result: {exc}; is this an "
                "rl-rollout server?"
            ) from exc
        return result

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send tensors (safetensors bytes over HTTP) for a full-weight sync."""
        tensors = {name: t.detach().contiguous().cpu() for name, t in named_tensors}
        if not tensors:
            raise ValueError("`named_tensors` is empty: nothing to sync")
        self._request(
            "/update_weights",
            save_safetensors(tensors),
            timeout=self.weight_sync_timeout,
            content_type="application/octet-stream",
            setting="weight_sync_timeout",
        )

    def load_lora(self, name: str, path: str) -> None:
        """Have the server (re)load the peft adapter at ``path`` (a path it can read)."""
        body = json.dumps({"name": name, "path": path}).encode()
        self._request(
            "/load_lora", body, timeout=self.weight_sync_timeout, setting="weight_sync_timeout"
        )

    def load_adapter(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        version: int,
    ) -> None:
        """Send a LoRA adapter's tensors: one safetensors body, no file on either side.

        The server generates with it from now on and tags each result with ``version``.

        The body is the tensors' bytes plus a safetensors header (names, shapes, the peft
        config as JSON); see :attr:`last_sync`. A server that is down or silent is tried
        ``sync_retries`` more times, each within ``weight_sync_timeout``. Both errors name the
        server's URL and the adapter.

        Raises:
            ValueError: the server refused the adapter (unknown target module, wrong rank...).
            RolloutServerError: no try succeeded.
        """
        adapter = LoraAdapter(name, int(version), dict(config), dict(tensors))
        body = adapter_to_bytes(adapter)
        what = f"{adapter.describe()} ({len(body)} bytes)"
        start = time.monotonic()
        for attempt in range(self.sync_retries + 1):
            try:
                self._request(
                    "/load_adapter",
                    body,
                    timeout=self.weight_sync_timeout,
                    content_type="application/octet-stream",
                    setting="weight_sync_timeout",
                )
                break
            except (ValueError, NotImplementedError) as exc:
                message = f"the rollout server at {self.base_url} refused {what}: {exc}"
                raise type(exc)(message) from exc
            except RolloutServerError as exc:
                if attempt == self.sync_retries:
                    raise RolloutServerError(
                        f"pushing {what} to the rollout server at {self.base_url} failed "
                        f"after {attempt + 1} tries ({time.monotonic() - start:.1f} s): {exc}"
                    ) from exc
                time.sleep(0.5 * 2**attempt)
        self.last_sync = {
            "bytes": float(len(body)),
            "tensor_bytes": float(adapter.tensor_bytes),
            "seconds": time.monotonic() - start,
        }

    def sleep(self, level: int = 1) -> None:
        """Put the server's engine to sleep (frees its GPU memory)."""
        body = json.dumps({"level": level}).encode()
        self._request(
            "/sleep", body, timeout=self.weight_sync_timeout, setting="weight_sync_timeout"
        )

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the server's engine."""
        body = json.dumps({"tags": None if tags is None else list(tags)}).encode()
        self._request(
            "/wake_up", body, timeout=self.weight_sync_timeout, setting="weight_sync_timeout"
        )


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
    return HFEngine(model, tokenizer, max_model_len=args.max_model_len)


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
    args = parser.parse_args(argv)
    name = args.served_model_name or args.model
    server = RolloutServer(
        _build_engine(args), args.host, args.port, model_name=name, tool_parser=args.tool_parser
    )
    print(f"rl-rollout server ({args.engine}) on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
