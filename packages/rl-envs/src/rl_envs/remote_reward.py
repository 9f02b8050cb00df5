"""A reward function served over HTTP, and its client: a reward model on another machine.

:class:`RewardServer` serves any reward function; :class:`RemoteReward` is a reward function
object that scores a whole batch of samples with one HTTP request (or one sample per call, as
:class:`~rl_envs.ReasoningGym` calls ``reward_fn(completion, answer, question)``). Standard
library only (``http.server``, ``http.client``, JSON); no pickle.

Wire format (JSON):

- ``GET /health`` -> ``{"status": "ok", "reward": <name>, "batched": bool}``
- ``POST /score`` ``{"prompts": [str] (N), "completions": [str] (N),
  "completion_ids": [[int]] (N) | null, "columns": {name: [value] (N)}}`` ->
  ``{"rewards": [float | null] (N)}``

Two kinds of reward function are served:

- per sample (AgileRL, ``ReasoningGym``): ``fn(completion, answer, question) -> float``, called
  with ``columns["answer"][i]`` and ``columns["question"][i]`` (default: ``prompts[i]``);
- batched (TRL): a function naming ``completions``, ``prompts`` or ``completion_ids`` (or taking
  only ``**kwargs``), called once as ``fn(prompts=..., completions=..., completion_ids=...,
  **columns) -> list[float | None]`` (without ``**kwargs``: only the arguments it names).

The client has a time budget per call (``timeout``: connecting, sending, reading the whole reply,
every retry and the backoff between them included; a server that trickles its reply is cut
off at it too), retries with exponential backoff what may pass (connection refused or
reset, no reply in time, HTTP 502/503/504), and then raises :class:`RewardServerError` naming
the URL, what failed and the fix. Errors of the reward function itself (HTTP 500) and bad
requests (HTTP 400) are not retried.

Start a server with ``rl-train reward-server --reward module:function --port 8001`` (it also
knows rl-train's built-in rewards) or ``python -m rl_envs.remote_reward --reward
module:function --port 8001``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib
import json
import math
import numbers
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rl_envs._signature import is_batched_reward
from rl_envs._signature import parameters as _parameters

__all__ = [
    "RemoteReward",
    "RewardRequest",
    "RewardServer",
    "RewardServerError",
    "is_batched_reward",
    "main",
    "score_request",
]

_MAX_BODY = 1024**3
#: Bytes asked of the socket per read of a reply (each read waits at most the time left).
_CHUNK = 64 * 1024
#: HTTP statuses a retry may cure (a proxy in front of a restarting server).
_RETRY_STATUS = (502, 503, 504)
_START_HINT = "start it with `rl-train reward-server --reward module:function --port PORT`"


class RewardServerError(RuntimeError):
    """A reward server could not be reached, did not answer in time, or failed."""


@dataclass(frozen=True)
class RewardRequest:
    """One batch of N samples to score (the body of ``POST /score``).

    Args:
        prompts: The N prompts, one per sample: text, or TRL's conversational form (a list of
            ``{"role", "content"}`` messages); any JSON value travels as it is.
        completions: The N completions (text, or messages).
        completion_ids: The N completions' token ids, or None.
        columns: Extra dataset columns, each a list of N JSON values (``answer``, ...).
    """

    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]] | None = None
    columns: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.completions)
        if len(self.prompts) != n:
            raise ValueError(f"`prompts` has {len(self.prompts)} entries for {n} completions")
        if self.completion_ids is not None and len(self.completion_ids) != n:
            raise ValueError(
                f"`completion_ids` has {len(self.completion_ids)} entries for {n} completions"
            )
        for name, values in self.columns.items():
            if name in ("prompts", "completions", "completion_ids"):
                raise ValueError(f"column {name!r} clashes with a request field; rename it")
            if not isinstance(values, list) or len(values) != n:
                raise ValueError(f"column {name!r} must be a list of {n} values (one per sample)")

    def to_json(self) -> dict[str, Any]:
        """The request as JSON types."""
        return {
            "prompts": self.prompts,
            "completions": self.completions,
            "completion_ids": self.completion_ids,
            "columns": self.columns,
        }

    @classmethod
    def from_json(cls, data: Any) -> RewardRequest:
        """Inverse of :meth:`to_json` (``ValueError`` on a malformed body)."""
        if not isinstance(data, dict) or "completions" not in data:
            raise ValueError("the body must be a JSON object with `completions` (and `prompts`)")
        completions = list(data["completions"])
        prompts = data.get("prompts")
        ids = data.get("completion_ids")
        return cls(
            prompts=[""] * len(completions) if prompts is None else list(prompts),
            completions=completions,
            completion_ids=None if ids is None else [[int(t) for t in row] for row in ids],
            columns=dict(data.get("columns") or {}),
        )


def _number(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item") and callable(value.item):  # a one-element tensor or array
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"reward {name} returned {value!r} for {where}; it must be a number")
    if not math.isfinite(float(value)):
        raise ValueError(f"reward {name} returned {value!r} for {where}; it must be finite")
    return float(value)


def _check_columns(fn: Callable[..., Any], request: RewardRequest) -> None:
    """A per-sample reward needs an ``answer`` column (``ValueError``: a bad request)."""
    if not is_batched_reward(fn) and "answer" not in request.columns:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise ValueError(
            f"reward {name} is per sample, (completion, answer, question) -> float: the request "
            "needs an `answer` column"
        )


def score_request(fn: Callable[..., Any], request: RewardRequest) -> list[float | None]:
    """Score ``request`` with ``fn`` in this process (what the server does).

    Args:
        fn: A per-sample ``(completion, answer, question) -> float`` or a batched reward
            (:func:`is_batched_reward`).
        request: The N samples.

    Returns:
        N rewards (None where a batched reward abstains).

    Raises:
        ValueError: A per-sample reward without an ``answer`` column, a wrong number of
            rewards, or a reward that is not a finite number.
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    n = len(request.completions)
    _check_columns(fn, request)
    if is_batched_reward(fn):
        kwargs = {
            "prompts": request.prompts,
            "completions": request.completions,
            "completion_ids": request.completion_ids,
            **request.columns,
        }
        found = _parameters(fn)
        if found is not None and not found[1]:  # no **kwargs: only what it names
            kwargs = {k: v for k, v in kwargs.items() if k in found[0]}
        out = fn(**kwargs)
        values = list(out)
        if len(values) != n:
            raise ValueError(f"reward {name} returned {len(values)} rewards for {n} samples")
        return [_number(v, name, f"sample {i}") for i, v in enumerate(values)]
    answers = request.columns["answer"]
    questions = request.columns.get("question", request.prompts)
    return [
        _number(fn(c, a, q), name, f"sample {i}")
        for i, (c, a, q) in enumerate(zip(request.completions, answers, questions, strict=True))
    ]


class RewardServer:
    """Serve the reward function ``fn`` over HTTP on ``host:port`` (``port=0``: a free one).

    Requests are scored one at a time (a lock around ``fn``: a reward model on one device).

    Args:
        fn: A per-sample or batched reward function (see :func:`score_request`).
        host: Interface to bind.
        port: TCP port; 0 picks a free one (see :attr:`url`).
    """

    def __init__(self, fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0) -> None:
        if not callable(fn):
            raise TypeError(f"`fn` must be a reward function, got {type(fn).__name__}")
        self.fn = fn
        self.name = str(getattr(fn, "__name__", type(fn).__name__))
        self.batched = is_batched_reward(fn)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: errors travel back to the client."""

            def do_GET(self) -> None:
                if self.path != "/health":
                    self._reply(404, {"error": "NotFound", "message": f"no route {self.path}"})
                    return
                health = {"status": "ok", "reward": server.name, "batched": server.batched}
                self._reply(200, health)

            def do_POST(self) -> None:
                if self.path != "/score":
                    self._reply(404, {"error": "NotFound", "message": f"no route {self.path}"})
                    return
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    if length < 0 or length > _MAX_BODY:
                        raise ValueError(f"Content-Length {length} is out of range")
                    request = RewardRequest.from_json(json.loads(self.rfile.read(length)))
                    _check_columns(server.fn, request)
                except (ValueError, TypeError) as exc:
                    self._reply(400, {"error": type(exc).__name__, "message": str(exc)})
                    return
                try:
                    with server._lock:
                        rewards = score_request(server.fn, request)
                except Exception as exc:  # the reward function's error, sent to the client
                    self._reply(500, {"error": type(exc).__name__, "message": str(exc)})
                    return
                self._reply(200, {"rewards": rewards})

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
        """``http://host:port`` of the server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RewardServer:
        """Serve in a background daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RetryableError(Exception):
    """One failed attempt that a retry may cure: ``what`` went wrong."""

    def __init__(self, what: str, *, timed_out: bool = False) -> None:
        super().__init__(what)
        self.what, self.timed_out = what, timed_out


class RemoteReward:
    """A reward function scored by a :class:`RewardServer` (one HTTP request per batch).

    Per sample, as ``ReasoningGym`` calls it: ``reward(completion, answer, question) -> float``.
    Batched, as TRL calls a reward function: ``reward(prompts=..., completions=...,
    completion_ids=..., **columns) -> list[float | None]`` (also :meth:`score`).

    Args:
        url: ``http://host:port`` of the server.
        timeout: Seconds one call may take in all: connecting, sending, waiting for and reading
            the whole reply, every retry and the backoff between them. A server that accepts
            and never answers, or answers a byte at a time, fails within it; a retry is only
            tried while time is left.
        retries: Further attempts after a failed one (connection refused or dropped, no reply,
            HTTP 502/503/504); 0: none.
        backoff: Seconds before the first retry, doubled before each next one.
        connect_timeout: Seconds to wait for the TCP connection of one attempt.
    """

    __name__ = "remote_reward"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        connect_timeout: float = 5.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"`url` must look like 'http://host:port', got {url!r}")
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if isinstance(value, bool) or not value > 0:
                raise ValueError(f"`{name}` must be > 0 seconds, got {value!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"`retries` must be an integer >= 0, got {retries!r}")
        if not backoff >= 0:
            raise ValueError(f"`backoff` must be >= 0 seconds, got {backoff!r}")
        self.url = url.rstrip("/")
        self._host, self._port = parts.hostname, parts.port
        self.timeout, self.retries, self.backoff = float(timeout), retries, float(backoff)
        self.connect_timeout = float(connect_timeout)

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r}, timeout={self.timeout}, retries={self.retries})"

    def __call__(
        self,
        completion: str | None = None,
        answer: Any = None,
        question: str | None = None,
        *,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> Any:
        """One sample's reward, or with ``completions=`` a batch's (see the class)."""
        if completions is not None:  # batched: `answer=` / `question=` are columns (TRL)
            for name, value in (("answer", answer), ("question", question)):
                if value is not None:
                    columns[name] = value
            return self.score(prompts, completions, completion_ids, **columns)
        if completion is None:
            raise TypeError(
                "RemoteReward takes (completion, answer, question) or completions=[...]"
            )
        prompt = "" if question is None else str(question)
        cols = {"answer": [answer], "question": [prompt], **{k: [v] for k, v in columns.items()}}
        (value,) = self.score([prompt], [completion], None, **cols)
        if value is None:
            raise RewardServerError(f"the reward server at {self.url} gave no reward (null)")
        return value

    def score(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Sequence[Any],
    ) -> list[float | None]:
        """Score N samples with one request.

        Args:
            prompts: N prompts (None: empty strings).
            completions: N completions.
            completion_ids: N token-id lists, or None.
            **columns: Extra columns of N JSON values each (``answer=[...]``, ...).

        Returns:
            N rewards (None where the server's batched reward abstains).

        Raises:
            RewardServerError: The server is down, silent past ``timeout`` or failed.
            ValueError: The request is malformed, or the server refused it as such.
        """
        request = RewardRequest(
            prompts=[""] * len(completions) if prompts is None else list(prompts),
            completions=list(completions),
            completion_ids=None
            if completion_ids is None
            else [[int(t) for t in row] for row in completion_ids],
            columns={k: list(v) for k, v in columns.items()},
        )
        try:
            body = json.dumps(request.to_json()).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the samples cannot be sent as JSON: {exc}") from exc
        payload = self._call("/score", body)
        rewards = payload.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != len(completions):
            raise RewardServerError(
                f"{self.url}/score answered {str(payload)[:200]}; expected "
                f"{{'rewards': [...]}} with {len(completions)} entries"
            )
        return [None if r is None else float(r) for r in rewards]

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer (raises :class:`RewardServerError` when down)."""
        return self._call("/health", None)

    def _call(self, path: str, body: bytes | None) -> dict[str, Any]:
        """One request with retries inside the ``timeout`` budget."""
        url = f"{self.url}{path}"
        start = time.monotonic()
        deadline = start + self.timeout
        delay, attempts, failure = self.backoff, 0, _RetryableError("no attempt")
        while True:
            attempts += 1
            try:
                status, data = self._attempt(path, body, deadline)
            except _RetryableError as exc:
                failure = exc
            else:
                if status not in _RETRY_STATUS:
                    return self._decode(url, status, data)
                failure = _RetryableError(f"HTTP {status}: {data[:200]!r}")
            left = deadline - time.monotonic()
            if attempts > self.retries or left <= 0:
                break
            time.sleep(min(delay, left))
            delay *= 2
            if time.monotonic() >= deadline:
                break
        took = time.monotonic() - start
        tries = f"{attempts} attempt{'s' if attempts > 1 else ''} in {took:.1f} s"
        if failure.timed_out:
            raise RewardServerError(
                f"the reward server at {url} did not reply in full within timeout={self.timeout} s "
                f"({failure.what}; {tries}): the server is stuck or too slow; check its log, "
                "or raise the timeout (data.reward_timeout)"
            )
        raise RewardServerError(
            f"the reward server at {url} is down or failing ({failure.what}; {tries}); "
            f"{_START_HINT}, or check the URL (data.reward_url)"
        )

    def _attempt(self, path: str, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        """One request, done by ``deadline`` (``time.monotonic()``) or a timed-out failure."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _RetryableError("the time budget was spent", timed_out=True)
        conn = http.client.HTTPConnection(
            self._host, self._port, timeout=min(self.connect_timeout, remaining)
        )
        response: http.client.HTTPResponse | None = None
        try:
            try:
                conn.connect()
            except TimeoutError as exc:
                raise _RetryableError(f"connecting timed out: {exc}", timed_out=True) from exc
            except OSError as exc:
                raise _RetryableError(f"cannot connect: {exc}") from exc
            sock = conn.sock  # kept: the connection lets go of it once the reply has come
            assert sock is not None
            sock.settimeout(max(1e-3, remaining))
            what = "no reply"
            try:
                if body is None:
                    conn.request("GET", path)
                else:
                    headers = {"Content-Type": "application/json"}
                    conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                what = "the reply was not complete"
                chunks: list[bytes] = []
                while True:  # the body in chunks, each read waiting at most the time left
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    sock.settimeout(left)
                    chunk = response.read1(_CHUNK)
                    if not chunk:
                        return response.status, b"".join(chunks)
                    chunks.append(chunk)
            except TimeoutError as exc:
                raise _RetryableError(what, timed_out=True) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise _RetryableError(f"the connection dropped: {exc!r}") from exc
        finally:
            if response is not None:
                response.close()  # the socket, when the connection has let go of it
            conn.close()

    def _decode(self, url: str, status: int, data: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise RewardServerError(
                f"{url} answered HTTP {status} with a body that is not JSON: {data[:200]!r}; "
                "is this a reward server?"
            ) from exc
        if status == 200 and isinstance(payload, dict):
            return payload
        message = payload.get("message", payload) if isinstance(payload, dict) else payload
        if status == 400:
            raise ValueError(f"the reward server at {url} refused the request: {message}")
        raise RewardServerError(
            f"the reward function on the server at {url} failed (HTTP {status}): "
            f"{payload.get('error', '') if isinstance(payload, dict) else ''} {message}".strip()
        )


def load_reward(spec: str) -> Callable[..., Any]:
    """The reward function ``module:function`` names (``ValueError`` when it does not resolve)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--reward must look like module:function, got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--reward {spec!r} does not resolve: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"--reward {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--reward``, ``--host``, ``--port`` arguments of a reward-server command."""
    parser.add_argument("--reward", required=True, help="module:function to serve")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8001, help="TCP port (0: a free one)")


def serve(fn: Callable[..., Any], host: str, port: int) -> None:
    """Serve ``fn`` until interrupted, printing the URL first."""
    server = RewardServer(fn, host, port)
    kind = "batched" if server.batched else "per sample"
    print(f"reward server ({server.name}, {kind}) on {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rl_envs.remote_reward --reward module:function --port PORT``."""
    parser = argparse.ArgumentParser(
        prog="python -m rl_envs.remote_reward",
        description="Serve a reward function over HTTP for RemoteReward clients.",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    serve(load_reward(args.reward), args.host, args.port)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
