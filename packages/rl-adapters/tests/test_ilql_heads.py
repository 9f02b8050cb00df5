"""ILQLHeads: shapes, target heads (frozen, Polyak averaging), training through LoRA or the full
model, and safetensors + JSON round trips (alone and inside an agent checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import adapters_testlib as tl
import pytest
import torch
from rl_adapters import (
    CheckpointError,
    ILQLHeads,
    ILQLHeadsConfig,
    PolicyModel,
    load_checkpoint,
    save_checkpoint,
)
from rl_testing.tolerance import assert_close

H, V = 64, 59  # the tiny model's hidden size and the char tokenizer's vocabulary


def heads(seed: int = 0, **kw: object) -> ILQLHeads:
    return ILQLHeads(ILQLHeadsConfig(hidden_size=H, vocab_size=V, **kw), seed=seed)  # type: ignore[arg-type]


def hidden(seed: int = 0, *shape: int) -> torch.Tensor:
    return torch.randn(*(shape or (2, 5)), H, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("two_qs", "mlp"), [(True, True), (False, True), (True, False)])
def test_shapes_and_targets_start_equal(two_qs: bool, mlp: bool) -> None:
    h = heads(two_qs=two_qs, mlp=mlp)
    out = h(hidden())
    assert len(out.qs) == len(out.target_qs) == (2 if two_qs else 1) == h.num_q_heads
    assert all(q.shape == (2, 5, V) for q in (*out.qs, *out.target_qs))
    assert out.values.shape == (2, 5)
    for q, tq in zip(out.qs, out.target_qs, strict=True):
        torch.testing.assert_close(q, tq, rtol=0, atol=0)  # bit-exact: targets copy the Q heads
        assert q.requires_grad and not tq.requires_grad
    assert all(not p.requires_grad for p in h.target_q_heads.parameters())
    expected = torch.stack(out.target_qs).amin(0) - out.values[..., None]
    # bit-exact: the same heads' kernels, then the same elementwise min and difference
    torch.testing.assert_close(h.advantages(hidden()), expected, rtol=0, atol=0)
    torch.testing.assert_close(h.target_q(hidden()), torch.stack(out.target_qs).amin(0))
    online = h.reduced_q(hidden(), "mean", target=False)
    torch.testing.assert_close(online, torch.stack(out.qs).mean(0).detach())
    if two_qs:  # the two Q heads are independent initialisations
        assert not torch.equal(out.qs[0], out.qs[1])  # bit-exact: two draws differ


def test_seeded_and_global_rng_untouched() -> None:
    state = torch.get_rng_state()
    a, b, c = heads(seed=1), heads(seed=1), heads(seed=2)
    assert torch.equal(torch.get_rng_state(), state)  # bit-exact: integer RNG state bytes
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])  # bit-exact: the same seeded draw
    # bit-exact: another seed draws other values
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())


def test_polyak_update_and_sync_period() -> None:
    h = heads(alpha=0.25, sync_every=3)
    with torch.no_grad():
        for p in h.q_heads.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in h.target_q_heads.state_dict().items()}
    online = {k: v.clone() for k, v in h.q_heads.state_dict().items()}
    assert [h.maybe_sync(s) for s in (1, 2)] == [False, False]
    # bit-exact: no sync yet, the targets are untouched
    assert all(torch.equal(v, h.target_q_heads.state_dict()[k]) for k, v in before.items())
    assert h.maybe_sync(3)
    for k, v in h.target_q_heads.state_dict().items():  # 0.25 * online + 0.75 * target
        assert_close(v, 0.25 * online[k] + 0.75 * before[k], msg=k)  # elementwise, another route
    h.sync_target(alpha=1.0)  # a copy
    for k, v in h.target_q_heads.state_dict().items():
        assert torch.equal(v, online[k])  # bit-exact: alpha = 1 copies
    with pytest.raises(ValueError, match=r"`alpha` must be in \[0, 1\]"):
        h.sync_target(alpha=1.5)


@pytest.mark.parametrize("full_finetune", [False, True])
def test_losses_train_heads_and_trunk_not_targets(full_finetune: bool) -> None:
    model = tl.base()
    kw = {"full_finetune": True, "reference": None} if full_finetune else {"lora_config": tl.lora()}
    policy = PolicyModel(model, **kw)  # type: ignore[arg-type]
    h = ILQLHeads.for_model(policy.causal_lm, seed=3)
    ids, mask = tl.batch(tl.vocab_size(model))
    out = h(policy.hidden_states(ids, mask))
    loss = sum(q.pow(2).mean() for q in out.qs) + out.values.pow(2).mean()
    loss.backward()
    assert all(
        p.grad is not None and bool(p.grad.abs().sum() > 0) for p in h.trainable_parameters()
    )
    assert all(p.grad is None for p in h.target_q_heads.parameters())
    trunk = policy.trainable_parameters("actor")
    assert trunk and any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in trunk)
    assert len(h.trainable_parameters()) == len(list(h.v_head.parameters())) + len(
        list(h.q_heads.parameters())
    )
    h.train()  # the targets stay frozen whatever the mode
    assert all(not p.requires_grad for p in h.target_q_heads.parameters())


def test_save_load_round_trip_is_exact(tmp_path: Path) -> None:
    h = heads(seed=4, two_qs=False, alpha=0.1, sync_every=2)
    with torch.no_grad():
        for p in h.q_heads.parameters():
            p.mul_(1.5)  # targets now differ from the Q heads
    h.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ilql_heads.json",
        "ilql_heads.safetensors",
    ]
    assert json.loads((tmp_path / "ilql_heads.json").read_text())["sync_every"] == 2
    back = ILQLHeads.load(tmp_path)
    assert back.config == h.config
    x = hidden(7)
    for a, b in zip((*h(x).qs, *h(x).target_qs), (*back(x).qs, *back(x).target_qs), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # bit-exact: load returns the saved heads
    assert all(not p.requires_grad for p in back.target_q_heads.parameters())
    with pytest.raises(FileNotFoundError, match="has no ilql_heads"):
        ILQLHeads.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="do not fit these ILQL heads"):
        heads(two_qs=True).load_tensors(h.tensors())


def test_load_of_corrupted_files_names_the_file(tmp_path: Path) -> None:
    heads(seed=1).save(tmp_path)
    config = tmp_path / "ilql_heads.json"
    good = config.read_text()
    config.write_text(good[: len(good) // 2])  # a save cut off mid-write
    with pytest.raises(CheckpointError, match=r"ilql_heads\.json is not valid JSON"):
        ILQLHeads.load(tmp_path)
    config.write_text(json.dumps({**json.loads(good), "gamma2": 0.5}))
    with pytest.raises(CheckpointError, match=r"ilql_heads\.json: unknown ILQL head config keys"):
        ILQLHeads.load(tmp_path)
    config.write_text(good)
    weights = tmp_path / "ilql_heads.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"ilql_heads\.safetensors is not valid safetensors"):
        ILQLHeads.load(tmp_path)


def _same(a: ILQLHeads, b: ILQLHeads) -> bool:
    # bit-exact: a loaded head holds the saved tensors
    return a.config == b.config and all(
        torch.equal(x, y) for x, y in zip(a.tensors().values(), b.tensors().values(), strict=True)
    )


@pytest.mark.parametrize("cut", ["weights written", "between the renames"])
def test_a_save_cut_off_keeps_the_previous_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """Both files were written in place: a save cut off between them (or inside one) left a
    new configuration beside old weights, or a truncated file."""
    import os

    import rl_adapters.ilql_heads as module

    before = heads(seed=1, alpha=0.1)
    before.save(tmp_path)
    after = heads(seed=2, alpha=0.5, sync_every=3)
    real_replace, calls = os.replace, []

    def replace(src: object, dst: object) -> None:
        calls.append(dst)
        if cut == "between the renames" and len(calls) == 2:
            raise OSError("killed (injected)")
        real_replace(src, dst)  # type: ignore[arg-type]

    def save_file(tensors: object, path: str, **kwargs: object) -> None:
        Path(path).write_bytes(b"\x08\x00\x00")  # a few bytes, then the disk is full
        raise OSError("disk full (injected)")

    if cut == "weights written":
        monkeypatch.setattr(module, "save_file", save_file)
    monkeypatch.setattr(module.os, "replace", replace)
    with pytest.raises(OSError, match="injected"):
        after.save(tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ilql_heads.json",
        "ilql_heads.safetensors",
    ]
    if cut == "between the renames":  # the new JSON is in place, the old weights too
        assert json.loads((tmp_path / "ilql_heads.json").read_text())["sync_every"] == 3
        with pytest.warns(RuntimeWarning, match=r"ilql_heads\.json differs from the configuration saved with ilql_heads\.safetensors"):  # fmt: skip
            back = ILQLHeads.load(tmp_path)
    else:
        back = ILQLHeads.load(tmp_path)
    assert _same(back, before)
    after.save(tmp_path)  # a later complete save replaces both
    assert _same(ILQLHeads.load(tmp_path), after)


def test_heads_saved_without_the_embedded_config_still_load(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    h = heads(seed=3)
    save_file(h.tensors(), str(tmp_path / "ilql_heads.safetensors"))
    (tmp_path / "ilql_heads.json").write_text(json.dumps(h.config.to_dict()))
    assert _same(ILQLHeads.load(tmp_path), h)


def test_inside_an_agent_checkpoint(tmp_path: Path) -> None:
    policy = PolicyModel(tl.base(), lora_config=tl.lora())
    h = ILQLHeads.for_model(policy.causal_lm, seed=5)
    with torch.no_grad():
        for p in h.q_heads.parameters():
            p.add_(0.5)
    opt = torch.optim.Adam([*policy.trainable_parameters(), *h.trainable_parameters()], lr=1e-3)
    save_checkpoint(policy, tmp_path / "ck", optimizer=opt, state={"step": 1},
                    heads={"ilql_heads": h})  # fmt: skip
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert {"ilql_heads.safetensors", "ilql_heads.json"} <= set(manifest["files"])
    assert manifest["heads"]["ilql_heads"]["config"] == h.config.to_dict()
    assert not [p for p in (tmp_path / "ck").rglob("*") if p.suffix in tl.PICKLE_SUFFIXES]

    fresh_policy = PolicyModel(tl.base(), lora_config=tl.lora())
    fresh = ILQLHeads.for_model(fresh_policy.causal_lm, seed=99)
    fresh_opt = torch.optim.Adam(
        [*fresh_policy.trainable_parameters(), *fresh.trainable_parameters()], lr=1e-3
    )
    assert load_checkpoint(fresh_policy, tmp_path / "ck", optimizer=fresh_opt,
                           heads={"ilql_heads": fresh}) == {"step": 1}  # fmt: skip
    for k, v in h.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k  # bit-exact: load returns the saved
    assert all(not p.requires_grad for p in fresh.target_q_heads.parameters())

    other = ILQLHeads.for_model(fresh_policy.causal_lm, two_qs=False)
    with pytest.raises(CheckpointError, match=r"head 'ilql_heads' does not fit"):
        load_checkpoint(fresh_policy, tmp_path / "ck", heads={"ilql_heads": other})
    # settings that do not change the tensors (the Polyak rate) may differ
    faster = ILQLHeads.for_model(fresh_policy.causal_lm, alpha=0.5, sync_every=1)
    load_checkpoint(fresh_policy, tmp_path / "ck", heads={"ilql_heads": faster})
    assert faster.config.alpha == 0.5
    for k, v in h.state_dict().items():
        assert torch.equal(v, faster.state_dict()[k]), k  # bit-exact: load returns the saved
    with pytest.raises(CheckpointError, match=r"holds no head 'extra'"):
        load_checkpoint(fresh_policy, tmp_path / "ck", heads={"extra": fresh})
    with pytest.raises(ValueError, match=r"`heads` key 'value_head' must be a Python identifier"):
        save_checkpoint(policy, tmp_path / "bad", heads={"value_head": h})


def test_bad_configs_and_inputs() -> None:
    with pytest.raises(ValueError, match="`vocab_size` must be an integer >= 1"):
        ILQLHeadsConfig(hidden_size=4, vocab_size=0)
    with pytest.raises(ValueError, match=r"`alpha` must be in \[0, 1\]"):
        ILQLHeadsConfig(hidden_size=4, vocab_size=3, alpha=2.0)
    with pytest.raises(ValueError, match="`sync_every` must be an integer >= 1"):
        ILQLHeadsConfig(hidden_size=4, vocab_size=3, sync_every=0)
    with pytest.raises(ValueError, match="`two_qs` must be true or false, got 'false'"):
        ILQLHeadsConfig.from_dict({"hidden_size": 4, "vocab_size": 3, "two_qs": "false"})
    with pytest.raises(ValueError, match="`alpha` must be a number in"):
        ILQLHeadsConfig.from_dict({"hidden_size": 4, "vocab_size": 3, "alpha": "0.1"})
    with pytest.raises(ValueError, match=r"unknown ILQL head config keys \['beta'\]"):
        ILQLHeadsConfig.from_dict({"hidden_size": 4, "vocab_size": 3, "beta": 1})
    with pytest.raises(ValueError, match=r"`hidden` has shape \[2, 5, 8\] but the heads expect"):
        heads()(torch.zeros(2, 5, 8))
    with pytest.raises(TypeError, match="must be an ILQLHeadsConfig"):
        ILQLHeads({"hidden_size": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot size ILQL heads"):
        ILQLHeads.for_model(torch.nn.Linear(2, 2))
