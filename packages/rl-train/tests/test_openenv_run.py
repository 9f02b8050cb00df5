"""``rl-train run`` with ``env: {openenv: ...}`` / ``env: {openenv_url: ...}``: the OpenEnv game
(rl_envs.openenv_game) trains with GRPO on the tiny model, served and in-process runs learn
identically, and the ids the trainer learns on are the ids generated and the template
rendered (issue 41)."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from env_testlib import write
from rl_envs.openenv import OpenEnvWrapper
from rl_envs.openenv_game import EchoAction, EchoDigitEnvironment, EchoObservation
from rl_envs.tools import TINY_TOOL_CHAT_TEMPLATE
from rl_testing.serving import serving
from rl_train.config import ConfigError, load_config
from rl_train.run import train
from rl_train.sources import MultiTurnSource

GAME = "rl_envs.openenv_game:EchoDigitEnvironment"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The game behind OpenEnv's create_app, served by uvicorn on a loopback port."""
    from openenv.core.env_server.http_server import create_app

    app = create_app(EchoDigitEnvironment, EchoAction, EchoObservation, max_concurrent_envs=40)
    with serving(app) as url:
        yield url


def test_grpo_learns_the_openenv_game_through_rl_train_run(tmp_path: Path) -> None:
    """The untrained tiny model repeats the question mark (return 0 on 32 unseen tasks); six
    GRPO steps of 4 tasks x 8 episodes take the greedy mean return to >= 0.5 (measured: 1.0
    at seeds 0, 1 and 2; a digit is worth 0.5, the asked digit 1)."""
    config = load_config(write(tmp_path, {"openenv": GAME, "max_turns": 2}, steps=6))
    summary = train(config, verbose=False)
    assert summary.accuracy_before <= 0.1, summary
    assert summary.accuracy_after >= 0.5, summary
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 6


def test_served_run_learns_exactly_as_the_in_process_run(tmp_path: Path, server: str) -> None:
    in_process = {"openenv": GAME, "max_turns": 2, "eval_episodes": 4}
    local = load_config(write(tmp_path / "a", in_process, steps=2))
    served = {
        "openenv_url": server,
        "action_class": "rl_envs.openenv_game:EchoAction",
        "observation_class": "rl_envs.openenv_game:EchoObservation",
        "max_turns": 2,
        "timeout": 20,
        "eval_episodes": 4,
    }
    remote = load_config(write(tmp_path / "b", served, steps=2))
    train(local, verbose=False)
    train(remote, verbose=False)

    def metrics(run: Path) -> list[dict[str, Any]]:
        rows = [json.loads(r) for r in (run / "run" / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "step_time"} for r in rows]

    # bit-exact: the same seeds, model and episodes; only the transport differs
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "exactly one of openenv"),
        ({"openenv": GAME, "verifiers": "m:t"}, "exactly one of openenv"),
        ({"openenv": "no_colon"}, "env.openenv must look like 'module:name'"),
        ({"openenv_url": "localhost:8000", "action_class": "m:A"}, "env.openenv_url must look"),
        ({"openenv_url": "http://127.0.0.1:1"}, "needs env.action_class"),
        ({"openenv": GAME, "max_turns": 0}, "env.max_turns must be >= 1"),
        ({"openenv": GAME, "timeout": 0}, "env.timeout must be > 0"),
        ({"openenv": GAME, "turns": 2}, "unknown key 'env.turns'; did you mean 'env.max_turns'"),
        ({"openenv": GAME, "async_": 1}, "unknown key 'env.async_'"),
    ],
)
def test_bad_env_sections_fail_when_the_config_is_read(
    tmp_path: Path, env: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, env))


def test_a_name_that_does_not_resolve_fails_before_training(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"openenv": "rl_envs.openenv_game:NoSuchGame"}))
    with pytest.raises(ConfigError, match=r"env\.openenv 'rl_envs\.openenv_game:NoSuchGame'"):
        train(config, verbose=False)


class _Recorder:
    """The agent as MultiTurnSource sees it, keeping each call's prompt and generated ids."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.group_size = agent.group_size
        self.calls: list[tuple[list[int], list[int]]] = []

    def get_action(self, obs: list[dict[str, Any]], **kw: Any) -> Any:
        result = self.agent.get_action(obs, **kw)
        completions, _, _ = result.rollout.blocks()
        for c, o in zip(completions, obs, strict=True):
            P = o["input_ids"].shape[1]
            self.calls.append((o["input_ids"][0].tolist(), c[0, P:].tolist()))
        return result


def test_trainer_ids_are_the_generated_ids_and_the_templates_rendering() -> None:
    """Single- and multi-turn episodes (solved at the first or the second answer): every row
    the trainer learns on is the tokenizer's rendering of the conversation, its action tokens
    are the generated ids (cut after EOS), and the environment's tokens are masked out."""
    from rl_train.demo import DemoConfig, build_agent
    from rl_train.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tok.chat_template = TINY_TOOL_CHAT_TEMPLATE  # user "text\n", assistant "text<eos>"
    agent = build_agent(DemoConfig(seed=0, group_size=8), tiny_model(len(tok), seed=0), tok)
    agent.max_output_tokens = 1

    built = itertools.count()

    def factory() -> OpenEnvWrapper:  # one answer for even episodes, two for odd ones
        game = EchoDigitEnvironment(digits="01", max_tries=1 + next(built) % 2)
        return OpenEnvWrapper(
            game, tok, max_turns=2, pad_id=2, max_model_len=64, max_output_tokens=1
        )

    recorder = _Recorder(agent)
    source = MultiTurnSource(factory, 2, batch_size=4, group_size=8)
    rollout = source.rollout(recorder, 0, 0).rollout
    generated = []  # (prompt, action as the wrapper keeps it: cut after EOS = pad_id)
    for prompt, ids in recorder.calls:
        generated.append((prompt, ids[: ids.index(2) + 1] if 2 in ids else ids))
    turns = []
    for n in range(rollout.input_ids.shape[0]):
        target = random.Random(n // 8).choice("01")  # group b's reset seed is b
        row = rollout.input_ids[n].tolist()
        actions = [t + 1 for t in range(len(row) - 1) if rollout.mask[n, t]]
        messages = [{"role": "user", "content": f"say {target}?"}]
        clean = True  # every action is text the tokenizer reproduces (no special token)
        for k, i in enumerate(actions):  # max_output_tokens=1: one token per turn
            assert (row[:i], [row[i]]) in generated  # what the engine sampled
            text = tok.decode([row[i]], skip_special_tokens=True)
            clean = clean and row[i] >= 4
            messages.append({"role": "assistant", "content": text})
            if k + 1 < len(actions):  # a wrong answer and another try
                messages.append({"role": "user", "content": f"no, say {target}?"})
        if not clean:
            continue
        turns.append(len(actions))
        rendered = tok.apply_chat_template(messages, tokenize=False)
        expected = list(tok(rendered, add_special_tokens=False)["input_ids"])[:-1]  # last EOS:
        length = actions[-1] + 1  # the episode ended on the action, nothing was appended
        assert row[:length] == expected
        assert not rollout.mask[n, length - 1 :].any()  # nothing learned past the episode
    assert {1, 2} <= set(turns), turns  # single- and multi-turn episodes both checked
    assert rollout.sampling_logprobs is not None
    assert torch.isfinite(rollout.sampling_logprobs[rollout.mask]).all()


def test_an_env_run_with_an_async_section_is_refused(tmp_path: Path) -> None:
    """Refused when the YAML is read, before a model is built."""
    path = write(tmp_path, {"openenv": GAME})
    with pytest.raises(ConfigError, match="env: runs are synchronous; remove the async section"):
        load_config(path, ["async.max_staleness=1"])


def test_an_env_run_checkpoints_and_resumes_like_an_uninterrupted_one(tmp_path: Path) -> None:
    """``train.checkpoint_steps`` and ``train.resume`` hold for ``env:`` runs too: a run cut
    at step 3 (checkpoint at 2) and resumed takes the uninterrupted run's steps 3 and 4 (each
    step's episodes come from the step's seed)."""
    env = {"openenv": GAME, "max_turns": 2}
    train(load_config(write(tmp_path / "full", env, steps=4, checkpoint_steps=2)), verbose=False)
    cut = tmp_path / "cut"
    train(load_config(write(cut, env, steps=3, checkpoint_steps=2)), verbose=False)
    pointer = cut / "run" / "checkpoints" / "latest.json"
    assert json.loads(pointer.read_text())["step"] == 3  # the last step is saved too
    # as if killed after step 3, before its checkpoint's pointer: resumed from step 2
    pointer.write_text(json.dumps({"name": "step_00000002", "step": 2}))
    train(load_config(write(cut, env, steps=4, checkpoint_steps=2, resume=True)), verbose=False)

    def rows(root: Path) -> list[dict[str, Any]]:
        out = [json.loads(r) for r in (root / "run" / "metrics.jsonl").read_text().splitlines()]
        for r in out:
            r.pop("step_time")
        return out

    full, resumed = rows(tmp_path / "full"), rows(cut)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed == full
