"""``rl-train tinker-server``: its arguments and its run (light: nothing heavy at import)."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tinker-server`` options."""
    parser.add_argument("--model", required=True, help="local directory of the base model")
    parser.add_argument(
        "--model-name", default=None, help="the base_model name clients pass (default: --model)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer path reported to clients (default: MODEL/tokenizer if present, else MODEL)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="the key clients must send, tml-... (default: the TINKER_API_KEY variable)",
    )
    parser.add_argument(
        "--checkpoint-dir", default="tinker-checkpoints", help="where checkpoints are written"
    )
    parser.add_argument("--max-context-length", type=int, default=None)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 with a one-line message for a missing extra or a bad key."""
    from rl_train.tinker import require_extra

    try:
        require_extra()
    except ImportError as exc:
        print(f"rl-train: {exc}", file=sys.stderr)
        return 2
    key = args.api_key or os.environ.get("TINKER_API_KEY")
    if not key:
        print(
            "rl-train: tinker-server needs --api-key or TINKER_API_KEY (tml-...)", file=sys.stderr
        )
        return 2
    from rl_train.tinker.app import ServerConfig, serve

    config = ServerConfig(
        model_path=args.model,
        api_key=key,
        checkpoint_dir=args.checkpoint_dir,
        model_name=args.model_name,
        tokenizer=args.tokenizer,
        max_context_length=args.max_context_length,
        host=args.host,
        port=args.port,
    )
    print(
        f"rl-train tinker-server: {config.name} on http://{config.host}:{config.port} "
        f"(TINKER_BASE_URL=http://{config.host}:{config.port})",
        flush=True,
    )
    serve(config)
    return 0
