"""``data.reward_protocol: openrlhf``: a run scored by an OpenRLHF reward server (its wire format,
``POST /get_reward {"query", "prompts", "labels"} -> {"rewards"}``) equals the same run scored in
process by the same ``reward_func(queries, prompts, labels)``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rl_train.cli import main
from rl_train.config import ConfigError, load_config

REWARD = (
    "def reward_func(queries, prompts, labels):\n"
    "    return [float(q[len(p):].split('<')[0].strip() == str(a)) + 0.01 * len(q)\n"
    "            for q, p, a in zip(queries, prompts, labels)]\n"
)
CONFIG = (
    "data:\n  n_train: 40\n  n_test: 8\n  prompts_per_step: 4\nagent:\n  group_size: 4\n"
    "train:\n  steps: 2\n  evaluation_interval: 2\n  checkpoint_steps: null\n"
)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "openrlhf_user_reward.py").write_text(REWARD)
    (tmp_path / "c.yaml").write_text(CONFIG)
    return tmp_path


@pytest.fixture
def server(user_dir: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenRLHF-protocol reward server running the user's reward_func."""
    namespace: dict[str, Any] = {}
    exec(REWARD, namespace)  # the user's file, as OpenRLHF's server loads it
    requests: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(data)
            rewards = namespace["reward_func"](data["query"], data["prompts"], data["labels"])
            body = json.dumps({"rewards": rewards}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/get_reward", requests
    finally:
        httpd.shutdown()
        httpd.server_close()


def _rewards(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["mean_reward"] for r in rows if "mean_reward" in r]


def test_an_openrlhf_server_run_equals_the_local_run(
    user_dir: Path, server: tuple[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, requests = server
    cfg = str(user_dir / "c.yaml")
    local, remote = user_dir / "local", user_dir / "remote"
    code = main(["run", cfg, "imports=[openrlhf_user_reward.py]",
                 "data.reward=openrlhf_user_reward:reward_func", f"train.run_dir={local}",
                 "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    code = main(["run", cfg, f"data.reward_url={url}", "data.reward_protocol=openrlhf",
                 f"train.run_dir={remote}", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    steps = [r for r in requests if len(r["query"]) == 16]  # 4 prompts x 4; the rest: evaluation
    assert len(steps) == 2
    assert all(q.startswith(p) for r in requests for q, p in zip(r["query"], r["prompts"], strict=True))  # fmt: skip
    rewards = _rewards(remote)
    assert len(rewards) == 2
    assert rewards == _rewards(local)  # the same run, bit for bit


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["data.reward_protocol=grpc"], "data.reward_protocol 'grpc' is unknown: use rl-envs or openrlhf"),
        (["data.reward_protocol=openrlhf"], "data.reward_protocol 'openrlhf' needs data.reward_url"),
        (["data.reward_protocol=openrlhf", "data.reward_url=http://h:5000"], "names no endpoint"),
        (["data.reward_url=http://h:5000/get_reward"], "has a path: .* data.reward_protocol: openrlhf"),
    ],
)  # fmt: skip
def test_bad_protocol_settings_are_config_errors(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)
