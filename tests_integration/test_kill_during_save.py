"""SIGKILL in the middle of a checkpoint write: the previous checkpoint stays loadable.

A subprocess saves a complete checkpoint, trains on, and is killed with SIGKILL while its next
save of the same checkpoint has a model file half written (rl-adapters writes into a temporary
directory and renames only once complete; the loop moves ``latest.json`` only after that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).resolve().parent / "scripts" / "kill_during_save.py"


def kill_mid_save(out: Path, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the second save is half written
        if line.strip() == "WRITING":
            break
    else:
        proc.wait(timeout=60)
        raise AssertionError(f"the script never reached the write: {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def fresh_agent():
    from rl_algos import GRPO
    from rl_train.tiny import TINY_AGENT, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    return GRPO(
        actor_network=tiny_model(len(tok), seed=5), pad_token_id=tok.pad_token_id,
        pad_token=tok.pad_token, tokenizer=tok, **{**TINY_AGENT, "group_size": 4, "full_finetune": True},
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["agent", "loop"])
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(
    tmp_path: Path, mode: str
) -> None:
    kill_mid_save(tmp_path, mode)
    if mode == "agent":
        path = tmp_path / "ckpt"
    else:
        from rl_train.loops import latest_checkpoint

        latest = latest_checkpoint(tmp_path)
        assert latest is not None and latest.name == "step_00000001"
        path = latest / "agent_0"
    # a half-written model file exists somewhere (the interrupted save's temporary directory)
    partial = [p for p in tmp_path.rglob("model.safetensors") if p.parent != path]
    assert partial, sorted(str(p) for p in tmp_path.rglob("*"))
    agent = fresh_agent()
    agent.load_checkpoint(path)
    assert agent.steps == 1
    first = load_file(str(tmp_path / "first.safetensors"))
    for name, p in agent.policy.named_parameters():
        assert torch.equal(p.detach(), first[name]), name  # bit-exact: a save/load round trip
