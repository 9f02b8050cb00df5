"""A tiny model on disk and a live ``rl-train tinker-server`` on a loopback port, for the tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from rl_testing.models import save_tiny, tiny_causal_lm
from rl_testing.serving import free_port, serving
from rl_train.tinker.app import ServerConfig, create_app

KEY = "tml-test-key"
MODEL = "tiny-qwen2"


def write_tiny(directory: Path, seed: int = 0) -> Path:
    """A tiny random qwen2 (weights from ``seed``) with its tokenizer saved to ``directory``."""
    model, tokenizer = tiny_causal_lm(seed=seed)
    save_tiny(model, tokenizer, directory)
    return directory


@contextlib.contextmanager
def running_server(
    model_dir: Path, checkpoint_dir: Path, model_name: str = MODEL
) -> Iterator[tuple[str, object]]:
    """Serve ``model_dir`` as ``model_name`` on a free loopback port; yield ``(base_url, app)``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: thread hand-offs cost more than the arithmetic
    config = ServerConfig(
        model_path=str(model_dir),
        api_key=KEY,
        checkpoint_dir=str(checkpoint_dir),
        model_name=model_name,
        port=free_port(),
    )
    app = create_app(config)
    try:
        with serving(app, port=config.port, log_level="warning") as url:
            yield url, app
    finally:
        app.state.service.queue.close()
        torch.set_num_threads(threads)
