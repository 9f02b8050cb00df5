"""save_checkpoint / load_checkpoint against the spec: layout and manifest, plain-PEFT loading,
exact round trips (every role, value head, optimizer, scheduler, RNG, state), bit-identical
continuation, atomicity, integrity checks, mismatches, and no pickle anywhere.

"A fresh PolicyModel" is always built from an identically-seeded tiny base with the same options.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import adapters_testlib as tl
import pytest
import torch
from peft import PeftModel
from rl_adapters import CheckpointError, PolicyModel, load_checkpoint, save_checkpoint
from rl_testing.tolerance import assert_close
from safetensors.torch import save_file

STATE: dict[str, Any] = {
    "step": 3,
    "tag": "run-a",
    "nested": {"xs": [1, 2.5, None, True], "s": "é"},
}


class Run:
    """A policy with an Adam optimizer over every trainable parameter and a StepLR scheduler."""

    def __init__(
        self,
        arch: str = "qwen2",
        *,
        r: int = 4,
        targets: Any = tl.LINEAR_NAMES,
        base: dict[str, Any] | None = None,
        **kw: Any,
    ):
        kw.setdefault("critic", True)
        if not kw.get("full_finetune"):
            kw.setdefault("lora_config", tl.lora(r=r, targets=targets))
        # PEFT injects into it in place: the policy's base_model; `base`: config overrides
        self.model = tl.base(arch, **(base or {}))
        self.policy = PolicyModel(self.model, **kw)
        self.params = self.policy.trainable_parameters()
        self.opt = torch.optim.Adam(self.params, lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
        self.ids, self.mask = tl.batch(tl.vocab_size(self.model), seed=0)

    def step(self) -> None:
        p = self.policy
        loss = tl.lm_loss(p.logits(self.ids, self.mask), self.ids, self.mask)
        if "critic" in p.roles:
            loss = loss + (p.values(self.ids, self.mask) - 0.5).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()

    def train(self, steps: int = 2, sync: bool = True) -> None:
        """Steps, with a reference sync in between so the reference differs from init too."""
        self.step()
        if sync and "reference" in self.policy.roles:
            self.policy.sync_reference()
        for _ in range(steps - 1):
            self.step()

    def save(self, directory: Path, **kw: Any) -> Path:
        kw.setdefault("optimizer", self.opt)
        kw.setdefault("scheduler", self.sched)
        kw.setdefault("state", STATE)
        return save_checkpoint(self.policy, directory, **kw)

    def load(self, directory: Path, **kw: Any) -> dict[str, Any]:
        kw.setdefault("optimizer", self.opt)
        kw.setdefault("scheduler", self.sched)
        return load_checkpoint(self.policy, directory, **kw)

    @torch.no_grad()
    def outputs(self) -> dict[str, torch.Tensor]:
        p = self.policy
        out = {r: p.logits(self.ids, self.mask, role=r) for r in p.roles}
        if "critic" in p.roles:
            out["values"] = p.values(self.ids, self.mask)
        return out


def _assert_outputs_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        # bit-exact: loaded (or resumed) weights through the same kernels as the saved run's
        torch.testing.assert_close(v, b[k], **tl.EXACT, msg=k)


def _saved(tmp_path: Path, **kw: Any) -> tuple[Run, Path]:
    run = Run(**kw)
    run.train()
    return run, run.save(tmp_path / "ckpt")


# --------------------------------------------------------------------------- layout


def test_layout_and_manifest(tmp_path: Path) -> None:
    run, directory = _saved(tmp_path)
    assert directory == tmp_path / "ckpt"
    files = tl.file_tree(directory)
    required = {
        *(
            f"{role}/{f}"
            for role in ("actor", "reference", "critic")
            for f in ("adapter_model.safetensors", "adapter_config.json")
        ),
        "value_head.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
        "scheduler.json",
        "rng.safetensors",
        "rng.json",
        "state.json",
        "manifest.json",
    }
    assert required <= files.keys(), sorted(required - files.keys())
    assert not [f for f in files if f.endswith(tl.PICKLE_SUFFIXES)]
    assert json.loads(files["state.json"]) == STATE
    for name in ("optimizer.json", "scheduler.json", "rng.json", "actor/adapter_config.json"):
        json.loads(files[name])  # plain JSON

    manifest = json.loads(files["manifest.json"])
    strings, ints = tl.json_scalars(manifest)
    for rel, data in files.items():
        if rel == "manifest.json":
            continue
        assert rel in strings, f"{rel} not listed in manifest.json"
        assert tl.sha256(data) in strings, f"sha256 of {rel} not in manifest.json"
        assert len(data) in ints, f"size of {rel} not in manifest.json"
    lowered = {s.lower() for s in strings}
    assert "qwen2" in lowered  # config.model_type
    assert "Qwen2ForCausalLM" in strings  # base model class name
    assert {"actor", "reference", "critic"} <= strings  # roles
    assert "q_proj" in strings  # LoRA configs
    assert any("version" in s.lower() for s in strings)  # format version
    assert run.policy.roles == ("actor", "reference", "critic")


def test_layout_without_reference_or_critic(tmp_path: Path) -> None:
    run = Run(reference=None, critic=False)
    run.train()
    directory = run.save(tmp_path / "ckpt")
    files = tl.file_tree(directory)
    assert "actor/adapter_model.safetensors" in files
    assert not any(f.startswith(("reference/", "critic/")) for f in files)
    assert "value_head.safetensors" not in files


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_actor_dir_loads_with_plain_peft(tmp_path: Path, arch: str) -> None:
    run, directory = _saved(tmp_path, arch=arch)
    expected = run.outputs()["actor"]
    peft_model = PeftModel.from_pretrained(tl.base(arch), directory / "actor")
    peft_model.eval()
    got = tl.forward_logits(peft_model, run.ids, run.mask)
    assert_close(got, expected, **tl.FORWARD)  # plain PEFT against the policy's forward
    assert not torch.allclose(got, tl.base_logits(arch, run.ids, run.mask), atol=1e-4)
    # the reference and critic adapter dirs are plain PEFT dirs too
    peft_model.load_adapter(str(directory / "reference"), adapter_name="ref_check")
    peft_model.set_adapter("ref_check")
    assert_close(
        tl.forward_logits(peft_model, run.ids, run.mask), run.outputs()["reference"], **tl.FORWARD
    )


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("arch", tl.ARCHS)
def test_round_trip_restores_everything(tmp_path: Path, arch: str) -> None:
    run, directory = _saved(tmp_path, arch=arch)
    expected = run.outputs()
    # bit-exact: trained after the sync, so the two differ
    assert not torch.equal(expected["actor"], expected["reference"])
    opt_state, sched_state = run.opt.state_dict(), run.sched.state_dict()
    assert run.policy.value_head is not None
    head = tl.snapshot(dict(run.policy.value_head.named_parameters()))
    after_save = (torch.rand(5), random.random())

    fresh = Run(arch=arch)  # building consumes the global RNG (value head init)
    torch.manual_seed(12345)
    random.seed(6789)
    state = fresh.load(directory)
    after_load = (torch.rand(5), random.random())

    assert state == STATE
    assert torch.equal(after_load[0], after_save[0])  # bit-exact: the restored RNG's next draw
    assert after_load[1] == after_save[1]
    _assert_outputs_equal(fresh.outputs(), expected)
    assert fresh.policy.value_head is not None
    got_head = dict(fresh.policy.value_head.named_parameters())
    assert all(torch.equal(head[k], got_head[k]) for k in head)  # bit-exact: load returns saved
    tl.assert_state_dicts_equal(fresh.opt.state_dict(), opt_state, "optimizer")
    tl.assert_state_dicts_equal(fresh.sched.state_dict(), sched_state, "scheduler")
    assert fresh.opt.param_groups[0]["lr"] == run.opt.param_groups[0]["lr"]
    # the trainable set is the spec's after loading
    assert all(p.requires_grad for p in fresh.policy.trainable_parameters())
    assert not any(p.requires_grad for p in tl.base_params(fresh.model).values())
    assert not any(p.requires_grad for p in tl.adapter_params(fresh.model, "reference").values())


def test_one_step_after_loading_is_bit_identical(tmp_path: Path) -> None:
    run, directory = _saved(tmp_path)
    fresh = Run()
    fresh.load(directory)
    run.step()
    fresh.step()
    for i, (a, b) in enumerate(zip(run.params, fresh.params, strict=True)):
        # bit-exact: a resumed step against the uninterrupted one
        assert torch.equal(a, b), f"trainable parameter {i} differs"
    tl.assert_state_dicts_equal(fresh.opt.state_dict(), run.opt.state_dict(), "optimizer")
    tl.assert_state_dicts_equal(fresh.sched.state_dict(), run.sched.state_dict(), "scheduler")
    _assert_outputs_equal(fresh.outputs(), run.outputs())


def test_full_finetune_round_trip(tmp_path: Path) -> None:
    run = Run(full_finetune=True, reference="copy", critic=False)
    run.train(steps=2, sync=False)
    directory = run.save(tmp_path / "ckpt")
    assert "model.safetensors" in tl.file_tree(directory)
    fresh = Run(full_finetune=True, reference="copy", critic=False)
    assert fresh.load(directory) == STATE
    # bit-exact: load returns the saved weights, run through the same kernels
    torch.testing.assert_close(fresh.outputs()["actor"], run.outputs()["actor"], **tl.EXACT)
    for a, b in zip(run.params, fresh.params, strict=True):
        assert torch.equal(a, b)  # bit-exact: load returns the saved tensors
    tl.assert_state_dicts_equal(fresh.opt.state_dict(), run.opt.state_dict(), "optimizer")
    run.step()
    fresh.step()
    # bit-exact: a resumed step against the uninterrupted one
    torch.testing.assert_close(fresh.outputs()["actor"], run.outputs()["actor"], **tl.EXACT)


def test_overwriting_a_checkpoint(tmp_path: Path) -> None:
    run, directory = _saved(tmp_path)
    run.step()
    second = {"step": 4}
    assert run.save(directory, state=second) == directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    fresh = Run()
    assert fresh.load(directory) == second
    _assert_outputs_equal(fresh.outputs(), run.outputs())


@pytest.mark.parametrize(
    "content",
    [{"important.txt": "precious"}, {"manifest.json": json.dumps({"format": "another-tool"})}],
)
def test_save_refuses_a_directory_that_is_not_a_checkpoint(
    tmp_path: Path, content: dict[str, str]
) -> None:
    run = Run()
    project = tmp_path / "project"
    project.mkdir()
    for name, text in content.items():
        (project / name).write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(f"`directory` {project} exists")) as info:
        run.save(project)
    assert "not an rl-adapters checkpoint" in str(info.value)
    assert "choose another directory or delete it" in str(info.value)
    assert {n: (project / n).read_text() for n in content} == content
    assert sorted(p.name for p in project.iterdir()) == sorted(content)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # no temp dir left


def test_save_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "afile"
    target.write_text("data")
    with pytest.raises(CheckpointError, match=re.escape(f"`directory` {target} exists")):
        Run().save(target)
    assert target.read_text() == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no backup or temp left


def test_save_into_an_empty_directory(tmp_path: Path) -> None:
    run = Run()
    (tmp_path / "ckpt").mkdir()
    directory = run.save(tmp_path / "ckpt")
    assert Run().load(directory) == STATE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# --------------------------------------------------------------------------- atomicity


def _boom(*args: object, **kwargs: object) -> Any:
    raise RuntimeError("boom while saving")


class _BadScheduler:
    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": 1, "fn": object()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise AssertionError("not reached")


@pytest.mark.parametrize(
    "failure", ["state", "optimizer", "scheduler_raises", "scheduler_not_json"]
)
def test_failed_save_leaves_previous_checkpoint_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    run, directory = _saved(tmp_path)
    first = run.outputs()
    before = tl.file_tree(directory)
    run.step()  # the policy moves on: a partial overwrite would be visible
    kw: dict[str, Any] = {}
    expected: type[Exception] | tuple[type[Exception], ...] = RuntimeError
    match: str | None = "boom"
    if failure == "state":
        kw["state"] = {"x": object()}
        expected, match = TypeError, "state"
    elif failure == "optimizer":
        monkeypatch.setattr(run.opt, "state_dict", _boom)
    elif failure == "scheduler_raises":
        monkeypatch.setattr(run.sched, "state_dict", _boom)
    else:
        kw["scheduler"] = _BadScheduler()
        expected, match = (TypeError, ValueError), None
    with pytest.raises(expected, match=match):
        run.save(directory, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "temporary directory left behind"
    assert tl.file_tree(directory) == before
    fresh = Run()
    assert fresh.load(directory) == STATE
    _assert_outputs_equal(fresh.outputs(), first)


def test_failed_first_save_leaves_nothing(tmp_path: Path) -> None:
    run = Run()
    parent = tmp_path / "runs"
    parent.mkdir()
    with pytest.raises(TypeError, match="state"):
        run.save(parent / "ckpt", state={"x": {1, 2}})
    assert list(parent.iterdir()) == []


# --------------------------------------------------------------------------- integrity


def test_flipped_bytes_are_a_value_error_naming_the_file(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    tl.flip_tail(directory / "actor" / "adapter_model.safetensors")
    fresh = Run()
    untouched = fresh.outputs()
    with pytest.raises(ValueError, match=re.escape("adapter_model.safetensors")):
        fresh.load(directory)
    _assert_outputs_equal(fresh.outputs(), untouched)  # verified before anything is restored


def test_truncated_file_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    path = directory / "value_head.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match=re.escape("value_head.safetensors")):
        Run().load(directory)


def test_tampered_state_json_is_a_value_error(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    (directory / "state.json").write_text(json.dumps({**STATE, "step": 4}))
    with pytest.raises(ValueError, match=re.escape("state.json")):
        Run().load(directory)


def test_missing_manifest_is_a_value_error(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    (directory / "manifest.json").unlink()
    with pytest.raises(ValueError, match="incomplete or not a checkpoint"):
        Run().load(directory)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="incomplete or not a checkpoint"):
        Run().load(empty)


def test_missing_adapter_dir_is_a_value_error(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    shutil.rmtree(directory / "reference")
    with pytest.raises(ValueError, match="reference"):
        Run().load(directory)


# --------------------------------------------------------------------------- no pickle


def _plant(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(tl.Payload(marker)))


def test_payload_is_live(tmp_path: Path) -> None:
    """Sanity check of the planted payload itself: unpickling it does create the marker."""
    marker = tmp_path / "marker"
    _plant(tmp_path / "evil.pt", marker)
    pickle.loads((tmp_path / "evil.pt").read_bytes())
    assert marker.exists()


def test_unlisted_pickle_files_are_ignored(tmp_path: Path) -> None:
    run, directory = _saved(tmp_path)
    marker = tmp_path / "marker"
    for rel in (
        "evil.pt",
        "optimizer.bin",
        "pytorch_model.bin",
        "actor/adapter_model.bin",
        "rng.pt",
    ):
        _plant(directory / rel, marker)
    fresh = Run()
    assert fresh.load(directory) == STATE
    assert not marker.exists()
    _assert_outputs_equal(fresh.outputs(), run.outputs())


@pytest.mark.parametrize("rel", ["evil.pt", "optimizer.bin"])
def test_manifest_listed_pickle_is_never_unpickled(tmp_path: Path, rel: str) -> None:
    _, directory = _saved(tmp_path)
    marker = tmp_path / "marker"
    _plant(directory / rel, marker)
    tl.add_to_manifest(directory, "state.json", rel)
    with contextlib.suppress(ValueError):  # rejecting it is fine too
        Run().load(directory)
    assert not marker.exists()


@pytest.mark.parametrize(
    "rel", ["optimizer.safetensors", "actor/adapter_model.safetensors", "rng.safetensors"]
)
def test_pickle_in_place_of_a_safetensors_file_is_rejected(tmp_path: Path, rel: str) -> None:
    _, directory = _saved(tmp_path)
    marker = tmp_path / "marker"
    _plant(directory / rel, marker)
    tl.set_manifest_entry(directory, rel)  # the manifest agrees with the planted bytes
    raised = False
    try:
        Run().load(directory)
    except Exception:
        raised = True
    assert raised, "a pickle posing as safetensors was accepted"
    assert not marker.exists()


def test_loading_never_calls_torch_load_or_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, directory = _saved(tmp_path)
    fresh = Run()

    def forbidden(*args: object, **kwargs: object) -> Any:
        raise AssertionError("torch.load / pickle used while loading a checkpoint")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    assert fresh.load(directory) == STATE
    _assert_outputs_equal(fresh.outputs(), run.outputs())


# --------------------------------------------------------------------------- mismatches


def test_lora_rank_mismatch_shows_both_configs(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path, r=3)
    with pytest.raises(ValueError, match=r"(?i)lora") as info:
        Run(r=5).load(directory)
    msg = str(info.value)
    assert re.search(r"\b3\b", msg)
    assert re.search(r"\b5\b", msg)


def test_lora_target_mismatch_shows_both_configs(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path, targets=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match=r"(?i)lora") as info:
        Run(targets=["q_proj", "k_proj"]).load(directory)
    msg = str(info.value)
    assert "v_proj" in msg
    assert "k_proj" in msg


def test_architecture_mismatch_shows_both(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path, arch="qwen2")
    with pytest.raises(ValueError, match=r"(?i)qwen2|llama") as info:
        Run(arch="llama").load(directory)
    msg = str(info.value).lower()
    assert "qwen2" in msg
    assert "llama" in msg


@pytest.mark.parametrize(
    ("saved", "loading"),
    [
        ({"critic": True}, {"critic": False}),
        ({"critic": False}, {"critic": True}),
        ({"reference": "adapter", "critic": False}, {"reference": None, "critic": False}),
    ],
)
def test_role_mismatch_is_a_value_error(
    tmp_path: Path, saved: dict[str, Any], loading: dict[str, Any]
) -> None:
    _, directory = _saved(tmp_path, **saved)
    with pytest.raises(ValueError, match=r"(?i)role|critic|reference"):
        Run(**loading).load(directory)


def test_mode_mismatch_is_a_value_error(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path, critic=False)
    with pytest.raises(ValueError, match=r"(?i)lora|full|model|mode"):
        Run(full_finetune=True, reference="copy", critic=False).load(directory)


# --------------------------------------------------------------------------- other base shapes


def _untouched(run: Run, before: dict[str, torch.Tensor]) -> None:
    after = run.policy.state_dict()
    assert after.keys() == before.keys()
    # bit-exact: a refused load writes no tensor, so every one keeps its bits
    assert [k for k, v in before.items() if not torch.equal(v, after[k])] == []


_OTHER_BASES = [
    ({"num_hidden_layers": 3}, "num_hidden_layers"),
    ({"num_attention_heads": 8, "num_key_value_heads": 8}, "num_attention_heads"),
    ({"num_key_value_heads": 4}, "num_key_value_heads"),
    ({"intermediate_size": 256}, "intermediate_size"),
]


@pytest.mark.parametrize(("base", "field"), _OTHER_BASES)
def test_other_base_shape_names_the_field(tmp_path: Path, base: dict[str, Any], field: str) -> None:
    _, directory = _saved(tmp_path)  # trained: a partial load would change the adapters
    other = Run(base=base)
    before = tl.snapshot(other.policy.state_dict())
    with pytest.raises(CheckpointError, match=rf"different base architecture: {field} = ") as info:
        other.load(directory)
    assert re.search(rf"{field} = \d+ in the checkpoint, \d+ in this model", str(info.value))
    _untouched(other, before)


def _as_old_manifest(directory: Path) -> None:
    """Drop the fields older manifests lack (the manifest is not listed in itself)."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    for key in (
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    ):
        del manifest[key]
    path.write_text(json.dumps(manifest))


_FULL = {"full_finetune": True, "reference": "copy", "critic": False}


@pytest.mark.parametrize("mode", [{}, _FULL], ids=["lora", "full"])
@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ({"num_hidden_layers": 3}, r"missing keys: \S*layers\.2\."),
        ({"num_attention_heads": 8, "num_key_value_heads": 8}, r"shapes: \S*k_proj\S* \["),
    ],
)
def test_old_manifest_other_shape_names_the_keys(
    tmp_path: Path, mode: dict[str, Any], base: dict[str, Any], expected: str
) -> None:
    run = Run(**mode)
    run.train(steps=2, sync=not mode)
    directory = run.save(tmp_path / "ckpt")
    _as_old_manifest(directory)
    assert Run(**mode).load(directory) == STATE  # an older checkpoint still loads
    other = Run(base=base, **mode)
    before = tl.snapshot(other.policy.state_dict())
    with pytest.raises(CheckpointError, match=expected) as info:
        other.load(directory)
    file = "model.safetensors" if mode else "actor/adapter_model.safetensors"
    assert f"checkpoint file {file} does not fit this model" in str(info.value)
    assert re.search(r" and \d+ more", str(info.value))  # a few shown, then a count
    _untouched(other, before)


def test_value_head_that_does_not_fit_changes_nothing(tmp_path: Path) -> None:
    _, directory = _saved(tmp_path)
    save_file(
        {
            "linear.weight": torch.zeros(1, 32),
            "linear.bias": torch.zeros(1),
            "extra": torch.ones(2),
        },
        str(directory / "value_head.safetensors"),
    )
    tl.set_manifest_entry(directory, "value_head.safetensors")
    fresh = Run()
    before = tl.snapshot(fresh.policy.state_dict())
    with pytest.raises(CheckpointError, match=r"value_head\.safetensors does not fit") as info:
        fresh.load(directory)
    assert "unexpected keys: extra" in str(info.value)
    assert "linear.weight [1, 32] saved, [1, 64] in the model" in str(info.value)
    _untouched(fresh, before)
