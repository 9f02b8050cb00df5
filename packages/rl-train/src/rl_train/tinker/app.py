"""The routes of the Tinker REST API (``/api/v1/...``) that the official ``tinker`` SDK calls.

FastAPI serves them; operations that touch the model are queued on a
:class:`~rl_train.tinker.futures.FutureQueue` and answered through ``retrieve_future``
(long-polled: the route waits up to :data:`POLL_SECONDS` for the result before it answers
``{"type": "try_again"}``). Every route but ``healthz`` requires the configured key in the
``X-API-Key`` header (401 otherwise, the SDK's ``AuthenticationError``). A request the server
refuses (unknown model, a ``Datum`` whose tensors disagree in length, an unsupported loss, a
sampling request over the context length, ...) fails its future with Tinker's
``{"error": ..., "category": "user"}``, which the SDK raises as ``tinker.RequestFailedError``;
the worker goes on serving.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rl_train.tinker import checkpoints
from rl_train.tinker.futures import Done, Failed, FutureQueue, Pending, UserError
from rl_train.tinker.losses import loss_spec
from rl_train.tinker.sampling import prompt_logprobs, sample
from rl_train.tinker.state import BaseModel, Snapshot
from rl_train.tinker.wire import decode_forward_backward, encode_sample_response

__all__ = ["POLL_SECONDS", "ServerConfig", "create_app"]

logger = logging.getLogger(__name__)

#: Longest wait of one ``retrieve_future`` call before it answers ``try_again``.
POLL_SECONDS = 5.0
PROTO = "application/x-protobuf"
V1 = "/api/v1"


@dataclass(frozen=True)
class ServerConfig:
    """What ``rl-train tinker-server`` serves."""

    model_path: str
    """A local directory holding the base model (``save_pretrained`` layout)."""
    api_key: str
    """The key clients must send (``TINKER_API_KEY``); must start with ``tml-``."""
    checkpoint_dir: str
    """Where ``save_state`` / ``save_weights_for_sampler`` write (and loads read)."""
    model_name: str | None = None
    """The ``base_model`` name clients ask for (default: ``model_path``)."""
    tokenizer: str | None = None
    """``get_info().model_data.tokenizer_id`` (default: ``model_path/tokenizer`` if it exists,
    else ``model_path``); the SDK loads it with ``AutoTokenizer.from_pretrained``."""
    max_context_length: int | None = None
    """Longest prompt + completion (default: the model's ``max_position_embeddings``)."""
    host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        if not self.api_key.startswith("tml-"):
            raise ValueError("`api_key` must start with 'tml-' (the tinker SDK refuses others)")

    @property
    def name(self) -> str:
        """The base model's name as clients pass it."""
        return self.model_name or self.model_path

    @property
    def tokenizer_id(self) -> str:
        """The tokenizer path reported by ``get_info``."""
        if self.tokenizer:
            return self.tokenizer
        sub = Path(self.model_path) / "tokenizer"
        return str(sub) if sub.is_dir() else self.model_path


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message, "message": message})


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """HTTP 500 naming the route and the exception, its traceback logged.

    The SDK retries a 5xx for about a minute, and the same request would fail the same way
    again: ``x-should-retry: false`` makes it raise at once. Answered here rather than by an
    exception handler, which would re-raise after answering and have the connection closed.
    """
    logger.error("tinker-server: %s failed", request.url.path, exc_info=exc)
    response = _error(
        500,
        f"the server failed on {request.url.path} ({type(exc).__name__}: {exc}); it keeps "
        "serving other requests: check the request's fields, or report the traceback in the "
        "server's log",
    )
    response.headers["x-should-retry"] = "false"
    return response


class Service:
    """The server's state: the model, sessions, sampling sessions and the future queue."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.base = BaseModel(config.model_path, max_context_length=config.max_context_length)
        self.tokenizer: Any = None
        self.root = Path(config.checkpoint_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.queue = FutureQueue()
        self.sessions: set[str] = set()
        self.samplers: dict[str, Snapshot] = {}
        self.sampler_paths: dict[str, str | None] = {}
        self.sampler_clients: dict[str, itertools.count[int]] = {}
        self.inflight: dict[str, list[str]] = {}
        """model_id -> its ``kind="inflight"`` sampling sessions (each save updates them all)."""
        self.run = uuid.uuid4().hex[:8]
        self.counter = itertools.count(1)

    # ----------------------------------------------------------------------- helpers
    @property
    def served(self) -> tuple[str, str]:
        """The names a checkpoint of the served base model records."""
        return (self.config.name, self.config.model_path)

    def check_base(self, base_model: str | None) -> None:
        """:class:`UserError` unless ``base_model`` is the served model."""
        if base_model not in (self.config.name, self.config.model_path):
            raise UserError(
                f"unknown base_model {base_model!r}: this server serves {self.config.name!r} "
                "only (see get_server_capabilities)"
            )

    def new_sampler(self, snapshot: Snapshot, model_path: str | None = None) -> str:
        """Register a sampling session on ``snapshot``; return its id."""
        session = f"sampler-{self.run}-{next(self.counter)}"
        self.samplers[session] = snapshot
        self.sampler_paths[session] = model_path
        self.sampler_clients[session] = itertools.count(1)
        return session

    def model_id(self, body: dict[str, Any]) -> str:
        """The SDK's id of a new training model: ``<session_id>:train:<model_seq_id>``."""
        model_id = f"{body['session_id']}:train:{int(body['model_seq_id'])}"
        if model_id in self.base.clients:
            raise UserError(f"model {model_id!r} exists already (model_seq_id reused)")
        return model_id

    def submit(self, operation: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Queue ``operation(*args)``; the ``UntypedAPIFuture`` JSON."""
        return {"request_id": self.queue.submit(lambda: operation(*args, **kwargs))}

    # ----------------------------------------------------------------------- operations
    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        """``create_model``: a LoRA training client on the base."""
        self.check_base(body.get("base_model"))
        lora = body.get("lora_config")
        if not lora:
            raise UserError("full fine-tuning is not served: pass lora_config (rank)")
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer {optimizer!r} is not served; only 'adamw'")
        model_id = self.model_id(body)
        self.base.create_client(
            model_id,
            int(lora["rank"]),
            seed=lora.get("seed"),
            train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
        )
        return {"model_id": model_id, "type": "create_model"}

    def save_weights(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        """``save_weights`` / ``save_weights_for_sampler``."""
        client = self.base.client(body["model_id"])
        name = body.get("path")
        sampler_kind = body.get("kind") or "snapshot"
        if sampler_kind not in ("snapshot", "inflight"):
            raise UserError(f"`kind` must be 'snapshot' or 'inflight', got {sampler_kind!r}")
        inflight = self.inflight.setdefault(client.model_id, [])
        if sampler_kind == "inflight":  # every inflight session of the model samples this save
            self.samplers.update(dict.fromkeys(inflight, self.base.snapshot(client.model_id)))
        if kind == "sampler_weights" and name is None:  # save_weights_and_get_sampling_client
            session = self.new_sampler(self.base.snapshot(client.model_id))
            if sampler_kind == "inflight":
                inflight.append(session)
            return {"sampling_session_id": session}
        if name is None:
            name = f"step-{client.steps:06d}"
        path = checkpoints.save(
            self.root,
            self.base,
            client,
            kind,
            name,
            self.config.name,
            # save_weights_for_sampler has no `overwrite`: a name saved again is replaced
            overwrite=kind == "sampler_weights" or bool(body.get("overwrite")),
            ttl_seconds=body.get("ttl_seconds"),
            user_metadata=body.get("user_metadata"),
        )
        return {
            "path": path,
            "type": "save_weights" if kind == "weights" else "save_weights_for_sampler",
        }

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """``load_weights`` into a client, or a new client from a checkpoint (no model_id)."""
        path = body["path"]
        meta = checkpoints.read_meta(self.root, path, self.served)
        model_id = body.get("model_id")
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"`optimizer` {optimizer!r} is not served; only 'adamw' (the default)")
        if model_id is None:
            self.check_base(body.get("base_model") or meta["base_model"])
            lora = checkpoints.lora_of(meta)
            model_id = self.model_id(body)
            self.base.create_client(model_id, lora.rank, seed=lora.seed, targets=lora.targets)
        client = self.base.client(model_id)
        checkpoints.load_state(
            self.root,
            self.base,
            client,
            path,
            optimizer=bool(body.get("optimizer")),
            served=self.served,
        )
        return {"path": path, "model_id": model_id, "type": "load_weights"}

    def sample(self, body: dict[str, Any]) -> bytes:
        """``asample``: completions with their sampling log-probs (protobuf)."""
        session = body.get("sampling_session_id")
        if session is not None:
            snapshot = self.samplers.get(session)
            if snapshot is None:
                raise UserError(f"unknown sampling_session_id {session!r}")
        elif body.get("model_path"):
            snapshot = checkpoints.load_snapshot(self.root, body["model_path"], self.served)
        else:
            self.check_base(body.get("base_model"))
            snapshot = Snapshot(None)
        for field in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(field):
                raise UserError(f"{field} is not served by this server (leave it 0)")
        if body.get("record_stability_info"):
            raise UserError(
                "`record_stability_info` is not served by this server (it feeds "
                "stable_reinforce, which is not served either): leave it unset"
            )
        for field in ("target_prompt_logprobs", "prompt_logprobs_last_n"):
            if body.get(field) is not None:
                raise UserError(f"{field} is not served by this server (leave it unset)")
        chunks = body["prompt"]["chunks"]
        if any(c.get("type", "encoded_text") != "encoded_text" for c in chunks):
            raise UserError("prompt chunks other than text tokens are not supported")
        tokens = [t for c in chunks for t in c.get("tokens", [])]
        vocab = int(self.base.model.config.vocab_size)
        if any(not 0 <= int(t) < vocab for t in tokens):
            raise UserError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        with self.base.sampling(snapshot) as model:
            sequences = sample(
                model,
                tokens,
                body.get("sampling_params") or {},
                int(body.get("num_samples", 1)),
                max_context_length=self.base.max_context_length,
                eos_token_id=self.base.eos_token_id,
                tokenizer=self.get_tokenizer(),
            )
            prompt_lp = prompt_logprobs(model, tokens) if body.get("prompt_logprobs") else None
        return encode_sample_response(sequences, prompt_lp)

    def get_tokenizer(self) -> Any:
        """The tokenizer (for stop strings), loaded on first use; None if it cannot load."""
        if self.tokenizer is None:
            try:
                from transformers import AutoTokenizer

                self.tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer_id)
            except (OSError, ValueError):
                return None
        return self.tokenizer


def create_app(config: ServerConfig) -> FastAPI:
    """The FastAPI application serving ``config``'s model."""
    service = Service(config)
    app = FastAPI(title="rl-train tinker-server")
    app.state.service = service

    @app.middleware("http")
    async def require_key(request: Request, call_next: Any) -> Any:
        if request.url.path != f"{V1}/healthz":
            given = request.headers.get("X-API-Key", "")
            if not hmac.compare_digest(given.encode(), config.api_key.encode()):
                return _error(401, "invalid API key: set TINKER_API_KEY to this server's key")
        try:
            return await call_next(request)
        except Exception as exc:  # not a UserError or KeyError (their handlers answered those)
            return _internal_error(request, exc)

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(KeyError)
    async def missing_field(_: Request, exc: KeyError) -> JSONResponse:
        return _error(400, f"the request lacks the field {exc.args[0]!r}")

    _session_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    return app


async def body_of(request: Request) -> dict[str, Any]:
    """The JSON object of a request; :class:`UserError` for anything else."""
    data = await request.json()
    if not isinstance(data, dict):
        raise UserError("the request body must be a JSON object")
    return data


def _session_routes(app: FastAPI, service: Service) -> None:
    """Health, capabilities, client config, sessions, telemetry, model info."""
    config = service.config

    @app.get(f"{V1}/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(f"{V1}/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return {
            "supported_models": [
                {
                    "model_name": config.name,
                    "max_context_length": service.base.max_context_length,
                    "trainable": True,
                    "sampleable": True,
                }
            ]
        }

    @app.post(f"{V1}/client/config")
    async def client_config() -> dict[str, Any]:
        return {
            "pjwt_auth_enabled": False,
            "proto_compress_fwdbwd": False,
            "use_pyqwest_transport": False,
            "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False,
            "sample_join_sampling_session": False,
        }

    @app.post(f"{V1}/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {"sample_cancel_enabled": False}

    @app.post(f"{V1}/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}

    @app.post(f"{V1}/create_session")
    async def create_session() -> dict[str, Any]:
        session = f"session-{service.run}-{next(service.counter)}"
        service.sessions.add(session)
        return {"session_id": session, "type": "create_session"}

    @app.post(f"{V1}/session_heartbeat")
    async def heartbeat() -> dict[str, str]:
        return {"type": "session_heartbeat"}

    @app.post(f"{V1}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str) -> dict[str, str]:
        service.sessions.discard(session_id)  # ServiceClient.close(): its clients stay served
        return {"status": "ok"}

    @app.post(f"{V1}/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        client = service.base.client((await body_of(request))["model_id"])
        return {
            "type": "get_info",
            "model_id": client.model_id,
            "model_name": config.name,
            "is_lora": True,
            "lora_rank": client.lora.rank,
            "model_data": {
                "arch": type(service.base.model).__name__,
                "model_name": config.name,
                "tokenizer_id": config.tokenizer_id,
            },
        }


def _training_routes(app: FastAPI, service: Service) -> None:
    """create_model, forward_backward / forward, optim_step, weights."""

    @app.post(f"{V1}/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return service.submit(service.create_model, await body_of(request))

    async def forward_backward(request: Request, forward_only: bool) -> dict[str, Any]:
        if request.headers.get("content-encoding"):
            raise UserError("compressed forward_backward bodies are not accepted by this server")
        decoded = decode_forward_backward(await request.body())
        try:  # refused now, answered through the future as the SDK expects
            loss_spec(decoded.loss_fn)
        except UserError as exc:
            return {"request_id": service.queue.fail(str(exc))}
        if forward_only and not decoded.forward_only:
            decoded = type(decoded)(**{**decoded.__dict__, "forward_only": True})
        return service.submit(service.base.forward_backward, decoded)

    @app.post(f"{V1}/forward_backward")
    async def forward_backward_route(request: Request) -> dict[str, Any]:
        return await forward_backward(request, False)

    @app.post(f"{V1}/forward")
    async def forward_route(request: Request) -> dict[str, Any]:
        return await forward_backward(request, True)

    @app.post(f"{V1}/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        params = body.get("adam_params") or body.get("optim_params") or {}
        if body.get("optimizer_params"):
            return {"request_id": service.queue.fail("only Adam (adam_params) is served")}
        return service.submit(service.base.optim_step, body["model_id"], params)

    @app.post(f"{V1}/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        return service.submit(service.save_weights, await body_of(request), "weights")

    @app.post(f"{V1}/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        return service.submit(service.save_weights, await body_of(request), "sampler_weights")

    @app.post(f"{V1}/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        return service.submit(service.load_weights, await body_of(request))


def _sampling_routes(app: FastAPI, service: Service) -> None:
    """Sampling sessions, asample, and the futures (retrieve_future, cancel_future)."""

    @app.post(f"{V1}/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        body = await body_of(request)
        if body.get("model_path"):
            snapshot = checkpoints.load_snapshot(service.root, body["model_path"], service.served)
        else:
            service.check_base(body.get("base_model"))
            snapshot = Snapshot(None)
        return {
            "type": "create_sampling_session",
            "sampling_session_id": service.new_sampler(snapshot, body.get("model_path")),
        }

    @app.get(f"{V1}/samplers/{{sampler_id}}")
    async def get_sampler(sampler_id: str) -> Any:
        if sampler_id not in service.samplers:
            return _error(404, f"unknown sampler {sampler_id!r}")
        return {
            "sampler_id": sampler_id,
            "base_model": service.config.name,
            "model_path": service.sampler_paths[sampler_id],
        }

    @app.post(f"{V1}/join_sampling_session")
    async def join_sampling_session(request: Request) -> Any:
        session = (await body_of(request))["sampling_session_id"]
        counter = service.sampler_clients.get(session)
        if counter is None:
            return _error(404, f"unknown sampling_session_id {session!r}")
        return {"type": "join_sampling_session", "client_counter": next(counter)}

    @app.post(f"{V1}/asample")
    async def asample(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        num = int(body.get("num_samples", 1))
        future = service.submit(service.sample, body)
        future["sample_sequence_ids"] = [f"{future['request_id']}-{i}" for i in range(num)]
        return future

    @app.post(f"{V1}/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        request_id = (await body_of(request))["request_id"]
        outcome = service.queue.get(request_id)
        waited = 0.0
        while isinstance(outcome, Pending) and waited < POLL_SECONDS:
            await asyncio.sleep(0.01)
            waited += 0.01
            outcome = service.queue.get(request_id)
        if outcome is None:
            return _error(404, f"unknown request_id {request_id!r} (or already retrieved)")
        if isinstance(outcome, Pending):
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if isinstance(outcome, Failed):
            return {"error": outcome.error, "category": outcome.category}
        assert isinstance(outcome, Done)
        if isinstance(outcome.value, bytes):
            return Response(content=outcome.value, media_type=PROTO)
        return outcome.value

    @app.post(f"{V1}/cancel_future")
    async def cancel_future() -> dict[str, str]:
        return {"status": "ok"}


def serve(config: ServerConfig) -> None:
    """Run the server until interrupted (uvicorn, one process)."""
    import uvicorn

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="warning")
