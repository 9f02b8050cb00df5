"""The client of a :class:`~rl_rollout.RolloutServer`: :class:`RemoteEngine`, an engine too.

Every call has a connect timeout and a deadline for the rest of the call and fails with a
:class:`RolloutServerError` naming the URL, the call and what to do, instead of hanging.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import torch
from safetensors.torch import save as save_safetensors

from rl_rollout._http import exchange
from rl_rollout._prompts import Prompts
from rl_rollout._wire import params_to_json, prompts_to_json, result_from_json
from rl_rollout.lora_sync import LoraAdapter, adapter_to_bytes
from rl_rollout.openai_trace import TraceCall
from rl_rollout.params import SamplingParams
from rl_rollout.result import RolloutResult

__all__ = ["RemoteEngine", "RolloutServerError"]

# what a rejected request raises on the client: the server's exception name -> client type
_CLIENT_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "KeyError": ValueError,
    "NotImplementedError": NotImplementedError,
}


class RolloutServerError(RuntimeError):
    """A rollout server could not be reached, did not answer in time, or failed."""


class RemoteEngine:
    """Client of a :class:`~rl_rollout.RolloutServer`; an :class:`~rl_rollout.Engine` too.

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
