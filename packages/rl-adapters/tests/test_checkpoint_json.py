"""A checkpoint's JSON files (manifest, state, optimizer, scheduler, RNG) that cannot be read,
are not JSON, are truncated or hold the wrong type: each is a ``CheckpointError`` naming the
file's path, raised before anything is restored.

The JSON files other than the manifest are covered by its sha256s, so those cases rewrite the
manifest entry to match (a hand-edited checkpoint, or one written by another tool): otherwise
the integrity check would catch them first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import CheckpointError, PolicyModel, load_checkpoint, save_checkpoint
from rl_adapters._checkpoint_read import _read_json


class Agent:
    """A policy (actor, reference and critic adapters) with an Adam optimizer and a scheduler."""

    def __init__(self) -> None:
        self.policy = PolicyModel(tl.base("qwen2"), lora_config=tl.lora(), critic=True)
        self.opt = torch.optim.Adam(self.policy.trainable_parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
        self.ids, self.mask = tl.batch(tl.vocab_size(self.policy.base_model), seed=0)

    def step(self) -> None:
        loss = tl.lm_loss(self.policy.logits(self.ids, self.mask), self.ids, self.mask)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()

    def load(self, directory: Path) -> dict[str, object]:
        return load_checkpoint(self.policy, directory, optimizer=self.opt, scheduler=self.sched)

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        return self.policy.logits(self.ids, self.mask).clone()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One trained checkpoint (Adam moments, scheduler state, RNG, caller state), written once."""
    agent = Agent()
    for _ in range(2):
        agent.step()
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    return save_checkpoint(
        agent.policy, root, optimizer=agent.opt, scheduler=agent.sched, state={"step": 2}
    )


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the saved checkpoint, to damage."""
    directory = tmp_path / "ckpt"
    shutil.copytree(saved, directory)
    yield directory
    for path in directory.rglob("*"):  # undo a chmod 0 so pytest can clean up
        path.chmod(0o700 if path.is_dir() else 0o600)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _write(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


def _expect(error: type[Exception], path: Path, why: str) -> Any:
    """``pytest.raises`` for a message naming ``path`` and then matching ``why``."""
    return pytest.raises(error, match=re.escape(str(path)) + ".*" + why)


def test_an_intact_copy_loads(ckpt: Path) -> None:
    """The baseline for every case below: the undamaged copy loads, and changes the model."""
    agent = Agent()
    before = agent.logits()
    assert agent.load(ckpt) == {"step": 2}
    assert not torch.equal(agent.logits(), before)  # bit-exact: the load changed the weights


MANIFEST_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "not-json": (_write("this is not JSON\n"), r"is not valid JSON \(Expecting value at line 1"),
    "truncated": (_truncate, r"is not valid JSON .*corrupted or truncated"),
    "empty": (_write(""), r"is not valid JSON"),
    "list": (_write("[]"), r"holds a JSON list, not the JSON object"),
    "string": (_write('"rl-adapters-checkpoint"'), r"holds a JSON str, not the JSON object"),
    "not-utf8": (lambda p: p.write_bytes(b'{"format": "\xff\xfe"}'), r"is not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_DAMAGE))
def test_unreadable_manifest_is_a_checkpoint_error_naming_it(ckpt: Path, case: str) -> None:
    damage, why = MANIFEST_DAMAGE[case]
    damage(ckpt / "manifest.json")
    agent = Agent()
    before = agent.logits()
    with _expect(CheckpointError, ckpt / "manifest.json", why) as info:
        agent.load(ckpt)
    assert not isinstance(info.value.__cause__, AssertionError)
    assert torch.equal(agent.logits(), before)  # bit-exact: nothing loaded, the same forward


def test_manifest_with_malformed_file_entries(ckpt: Path) -> None:
    path = ckpt / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["state.json"] = {"size": 12}  # no sha256
    path.write_text(json.dumps(manifest))
    with _expect(CheckpointError, path, r"is malformed: 'files' must map every file name"):
        Agent().load(ckpt)
    manifest["files"] = ["state.json"]
    path.write_text(json.dumps(manifest))
    with _expect(CheckpointError, path, r"is malformed"):
        Agent().load(ckpt)


def test_manifest_without_read_permission(ckpt: Path) -> None:
    path = ckpt / "manifest.json"
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("this user reads files whatever their mode (root); see the next test")
    with _expect(CheckpointError, path, r": Permission denied; check its permissions"):
        Agent().load(ckpt)


def test_a_file_the_os_refuses_to_read_is_named(tmp_path: Path) -> None:
    """The OSError path for any user: reading a directory as a file (EISDIR)."""
    with pytest.raises(CheckpointError, match=r"^cannot read checkpoint file "):
        _read_json(tmp_path)
    with _expect(CheckpointError, tmp_path, r": Is a directory; check its permissions"):
        _read_json(tmp_path)


def _first_tensor_ref_renamed(path: Path) -> None:
    text = path.read_text()
    assert '"__tensor__": "' in text
    path.write_text(text.replace('"__tensor__": "', '"__tensor__": "no-such-tensor', 1))


OTHER_DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "state-truncated": ("state.json", _truncate, r"is not valid JSON"),
    "state-list": ("state.json", _write("[2]"), r"holds a JSON list"),
    "state-not-utf8": ("state.json", lambda p: p.write_bytes(b"\x80"), r"is not UTF-8 text"),
    "optimizer-not-json": ("optimizer.json", _write("{'state': {}}"), r"is not valid JSON"),
    "optimizer-truncated": ("optimizer.json", _truncate, r"is not valid JSON"),
    "optimizer-number": ("optimizer.json", _write("3"), r"holds a JSON int"),
    "optimizer-missing-tensor": (
        "optimizer.json",
        _first_tensor_ref_renamed,
        r"is malformed or does not match optimizer\.safetensors \(KeyError",
    ),
    "optimizer-not-a-dict": (
        "optimizer.json",
        _write('{"__tuple__": [1, 2]}'),
        r"holds a tuple, not the state dict",
    ),
    "scheduler-list": ("scheduler.json", _write("[]"), r"holds a JSON list"),
    "rng-truncated": ("rng.json", _truncate, r"is not valid JSON"),
    "rng-wrong-content": ("rng.json", _write('{"__dict__": []}'), r"does not hold the RNG"),
}


@pytest.mark.parametrize("case", sorted(OTHER_DAMAGE))
def test_unreadable_state_json_is_a_checkpoint_error_naming_it(ckpt: Path, case: str) -> None:
    name, damage, why = OTHER_DAMAGE[case]
    damage(ckpt / name)
    tl.set_manifest_entry(ckpt, name)  # consistent manifest: only the JSON check can catch it
    agent = Agent()
    before = agent.logits()
    with _expect(CheckpointError, ckpt / name, why):
        agent.load(ckpt)
    # bit-exact: nothing loaded, the same forward on the same weights
    assert torch.equal(agent.logits(), before), "a failed load must not restore anything"


def test_missing_optimizer_state_is_reported_before_restoring(tmp_path: Path) -> None:
    agent = Agent()
    agent.step()
    directory = save_checkpoint(agent.policy, tmp_path / "ckpt")  # no optimizer, no scheduler
    other = Agent()
    before = other.logits()
    with pytest.raises(CheckpointError, match=re.escape(f"{directory} holds no optimizer state")):
        other.load(directory)
    with pytest.raises(CheckpointError, match="holds no scheduler state"):
        load_checkpoint(other.policy, directory, scheduler=other.sched)
    assert torch.equal(other.logits(), before)  # bit-exact: nothing loaded, the same forward


def test_checkpoint_error_is_one_class_wherever_it_is_imported_from() -> None:
    import rl_adapters
    import rl_adapters._checkpoint_read
    import rl_adapters.checkpoint

    assert rl_adapters.CheckpointError is rl_adapters.checkpoint.CheckpointError
    assert rl_adapters.checkpoint.CheckpointError is rl_adapters._checkpoint_read.CheckpointError
    assert issubclass(CheckpointError, ValueError)
