"""The unmodified tinker-cookbook math RL recipe against a local ``rl-train tinker-server``.

Used by ``nox -s tinker-cookbook`` (not a default session): the server runs from one
environment (rl-train with its ``tinker`` extra), the recipe from another (``tinker-cookbook``
and its own pins, e.g. transformers 5.5.4 for 0.5.8, which the workspace lock cannot hold):
they only share HTTP on loopback. A tiny random Qwen2 with the character tokenizer of
``rl_train.tiny`` is written to ``WORK/model`` (model and tokenizer files in one directory, so
that the recipe's ``AutoTokenizer.from_pretrained(model_name)`` loads it), the server serves it
under that path, and the recipe runs two steps of ``env=arithmetic``,
``loss_fn=importance_sampling``, the ``role_colon`` renderer and groups of 2; the check is that
it exits 0 and its ``metrics.jsonl`` holds both steps.

    python tools/tinker_cookbook_check.py --server-python .venv/bin/python
        --cookbook-python /tmp/cookbook/bin/python --work /tmp/cookbook-run    (one line)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

KEY = "tml-cookbook-check"
#: Hang guards (seconds): the server's start (torch import, model load) and the recipe's run.
START_GUARD_S = 300
RECIPE_GUARD_S = 1200

WRITE_MODEL = """
import sys
from rl_train.tiny import tiny_model, tiny_tokenizer
tokenizer = tiny_tokenizer()
tiny_model(len(tokenizer)).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
"""


def recipe_command(python: str, model: Path, port: int, log_path: Path) -> list[str]:
    """The recipe's command line (``chz`` key=value options of its ``CLIConfig``)."""
    options = {
        "model_name": str(model),
        "renderer_name": "role_colon",
        "env": "arithmetic",
        "loss_fn": "importance_sampling",
        "group_size": 2,
        "groups_per_batch": 2,
        "max_tokens": 8,
        "lora_rank": 4,
        "max_steps": 2,
        "eval_every": 0,
        "save_every": 0,
        "base_url": f"http://127.0.0.1:{port}",
        "log_path": str(log_path),
        "behavior_if_log_dir_exists": "delete",
    }
    args = [f"{k}={v}" for k, v in options.items()]
    return [python, "-m", "tinker_cookbook.recipes.math_rl.train", *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_healthy(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the server did not answer within {START_GUARD_S} s")


def main(argv: list[str] | None = None) -> int:
    """Write the model, start the server, run the recipe, check its metrics; 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-python", required=True, help="Python with rl-train[tinker]")
    parser.add_argument("--cookbook-python", required=True, help="Python with tinker-cookbook")
    parser.add_argument("--work", required=True, help="a scratch directory")
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    subprocess.run([args.server_python, "-c", WRITE_MODEL, str(model)], check=True)
    port = _free_port()
    env = {**os.environ, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}
    server_log = (work / "server.log").open("wb")
    serve = [args.server_python, "-m", "rl_train", "tinker-server", "--model", str(model)]
    server = subprocess.Popen(
        [*serve, "--port", str(port), "--checkpoint-dir", str(work / "checkpoints")],
        env=env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server)
        log_path = work / "math_rl"
        command = recipe_command(args.cookbook_python, model, port, log_path)
        print("running:", " ".join(command), flush=True)
        subprocess.run(command, env=env, cwd=work, check=True, timeout=RECIPE_GUARD_S)
        rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
        steps = [row["step"] for row in rows]
        if steps != [0, 1]:
            print(f"expected metrics of steps [0, 1], got {steps}", file=sys.stderr)
            return 1
        print(f"math_rl ran 2 steps against the server; metrics in {log_path / 'metrics.jsonl'}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=60)
        server_log.close()


if __name__ == "__main__":
    raise SystemExit(main())
