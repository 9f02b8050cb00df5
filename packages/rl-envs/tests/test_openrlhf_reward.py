"""An OpenRLHF reward server (``--remote_rm_url``) scoring a ReasoningGym's samples.

The server here is a standard-library HTTP server written to OpenRLHF's ``serve_rm`` wire format:
``POST /get_reward {"query", "prompts", "labels"}`` -> ``{"rewards", "scores", "extra_logs"}``.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch
from datasets import Dataset
from envs_testlib import encode, tok
from rl_envs import ReasoningGym, detect_reward_style
from rl_envs.openrlhf_reward import OpenRLHFRemoteReward
from rl_envs.remote_reward import RewardServerError

EOS = 2
ROWS = [{"prompt": f"say {d}?", "answer": str(d)} for d in range(4)]


class OpenRLHFServer:
    """Scores ``query`` by whether it ends with its label; ``extra`` keys go in the answer."""

    def __init__(self, extra: dict[str, Any] | None = None, rewards: Any = None) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, **data})
                scores = [float(q.removesuffix("<eos>").endswith(label))
                          for q, label in zip(data["query"], data["labels"], strict=True)]  # fmt: skip
                body = json.dumps({"rewards": scores if rewards is None else rewards,
                                   **(extra or {})}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/get_reward"


@pytest.fixture
def server() -> Iterator[OpenRLHFServer]:
    s = OpenRLHFServer()
    yield s
    s.httpd.shutdown()


def gym(reward: Any) -> ReasoningGym:
    data = Dataset.from_list(ROWS)
    return ReasoningGym(data, data, tok(), reward, data_batch_size_per_gpu=2, shuffle=False)


def rows_of(batch: Any, texts: list[list[str]]) -> list[torch.Tensor]:
    out = []
    for prompt, group in zip(batch, texts, strict=True):
        rows = [prompt["input_ids"][0].tolist() + encode(t) + [EOS] for t in group]
        width = max(map(len, rows))
        out.append(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    return out


def test_a_gym_scores_with_the_server_in_openrlhfs_wire_format(server: OpenRLHFServer) -> None:
    reward = OpenRLHFRemoteReward(server.url, timeout=30)
    assert detect_reward_style(reward) == "openrlhf"
    env = gym(reward)
    batch = env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rewards alone: nothing to warn about
        _, rewards = env.step(rows_of(batch, [["0", "5"], ["1", "1"]]))
    # bit-exact: 0/1 rewards
    assert rewards.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    [request] = server.requests
    assert request["path"] == "/get_reward"
    assert request["query"][1] == batch[0]["text"] + "5<eos>"  # prompt + completion, EOS kept
    assert request["prompts"] == [batch[0]["text"]] * 2 + [batch[1]["text"]] * 2
    assert request["labels"] == ["0", "0", "1", "1"]


def test_scores_and_extra_logs_are_named_as_not_read() -> None:
    server = OpenRLHFServer(extra={"scores": [1.0] * 4, "extra_logs": {"n": [1] * 4}})
    try:
        env = gym(OpenRLHFRemoteReward(server.url, timeout=30))
        env.reset()
        with pytest.warns(UserWarning, match=r"openrlhf_remote_reward returned \['extra_logs', 'scores'\] next to 'rewards'"):  # fmt: skip
            env.step([["0", "x"], ["1", "y"]])
    finally:
        server.httpd.shutdown()


def test_a_wrong_answer_or_a_down_server_is_a_clear_error() -> None:
    server = OpenRLHFServer(rewards=[1.0])
    try:
        reward = OpenRLHFRemoteReward(server.url, timeout=30)
        with pytest.raises(RewardServerError, match=r"expected \{'rewards': \[...\]\} with 2 entries"):  # fmt: skip
            reward(["a", "b"], ["p", "p"], ["x", "y"])
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()  # the port refuses connections from now on
    down = OpenRLHFRemoteReward(server.url, timeout=2, retries=0)
    with pytest.raises(RewardServerError, match=r"the reward server at http://127\.0\.0\.1:\d+/get_reward is down"):  # fmt: skip
        down(["a"], ["p"], ["x"])
    with pytest.raises(ValueError, match=r"names no endpoint: .*/get_reward"):
        OpenRLHFRemoteReward("http://127.0.0.1:5000")
    with pytest.raises(ValueError, match=r"one entry per sample, got 2, 1 and 1"):
        down(["a", "b"], ["p"], ["x"])
    with pytest.raises(NotImplementedError, match=r"call it as reward\(queries, prompts, labels\)"):
        down.score(["p"], ["c"])
