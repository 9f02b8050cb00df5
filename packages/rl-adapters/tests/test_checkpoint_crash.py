"""A crash in the middle of a save never costs the previous checkpoint."""

import os
from pathlib import Path

import adapters_testlib as tl
import pytest
import rl_adapters
import rl_adapters.checkpoint as ckpt
import torch
from peft import LoraConfig
from rl_testing.models import tiny_causal_lm
from rl_testing.tolerance import assert_close

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def _policy() -> rl_adapters.PolicyModel:
    model, _ = tiny_causal_lm("qwen2", seed=0)
    return rl_adapters.PolicyModel(model, lora_config=LORA, reference="adapter", critic=True)


def _train_step(policy: rl_adapters.PolicyModel, ids: torch.Tensor) -> None:
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    loss = policy.logits(ids, torch.ones_like(ids)).log_softmax(-1)[..., 1].mean()
    loss.backward()
    optimizer.step()


def test_exception_after_some_files_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    policy = _policy()
    _train_step(policy, ids)
    target = tmp_path / "checkpoint"
    ckpt.save_checkpoint(policy, target, state={"step": 1})
    with torch.no_grad():
        saved_logits = policy.logits(ids, torch.ones_like(ids)).clone()

    _train_step(policy, ids)  # the model moves on; a second save then dies half-way
    real = ckpt._save_structured
    written: list[str] = []

    def failing(directory: Path, stem: str, obj: object) -> None:
        written.extend(p.name for p in directory.iterdir())
        if stem == "rng":  # adapters, value head and optimizer are already on disk
            raise OSError("disk full (injected)")
        real(directory, stem, obj)

    monkeypatch.setattr(ckpt, "_save_structured", failing)
    with pytest.raises(OSError, match="injected"):
        ckpt.save_checkpoint(policy, target, state={"step": 2})
    assert "actor" in written  # the crash really happened after some files
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no temp dir left
    fresh = _policy()
    assert rl_adapters.load_checkpoint(fresh, target) == {"step": 1}
    with torch.no_grad():
        torch.testing.assert_close(fresh.logits(ids, torch.ones_like(ids)), saved_logits)


def test_partial_directory_is_rejected(tmp_path: Path) -> None:
    policy = _policy()
    target = tmp_path / "checkpoint"
    ckpt.save_checkpoint(policy, target)
    (target / "manifest.json").unlink()  # what a save killed before its last write leaves
    with pytest.raises(rl_adapters.CheckpointError, match="incomplete or not a checkpoint"):
        rl_adapters.load_checkpoint(_policy(), target)


def test_interrupted_swap_is_recovered(tmp_path: Path) -> None:
    """A save killed between moving the old checkpoint aside and moving the new one in."""
    policy = _policy()
    target = tmp_path / "checkpoint"
    ckpt.save_checkpoint(policy, target, state={"step": 7})
    backup = tmp_path / ".checkpoint.old-abc123"
    os.rename(target, backup)
    with pytest.warns(UserWarning, match="restored"):
        state = rl_adapters.load_checkpoint(_policy(), target)
    assert state == {"step": 7}
    assert target.is_dir()
    assert not backup.exists()


def test_adapter_init_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = _policy()
    # bit-exact: construction drew nothing globally, the same next draw
    assert torch.equal(torch.rand(3), expected_next)
    second = _policy()
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters(), strict=True):
        assert torch.equal(a, b), name  # bit-exact: the same seeded init
    model, _ = tiny_causal_lm("qwen2", seed=0)
    other = rl_adapters.PolicyModel(model, lora_config=LORA, seed=1, critic=True)
    a_first = dict(first.named_parameters())
    # bit-exact: another seed draws other values
    assert any(not torch.equal(p, a_first[n]) for n, p in other.named_parameters() if "lora_A" in n)


def test_from_pretrained_and_activation_offload(tmp_path: Path) -> None:
    model, _ = tiny_causal_lm("llama", seed=0)
    model.save_pretrained(tmp_path / "base")
    policy = rl_adapters.PolicyModel.from_pretrained(
        str(tmp_path / "base"),
        model_config={"local_files_only": True},
        lora_config=LORA,
        activation_offload=True,
    )
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    plain = rl_adapters.PolicyModel(tiny_causal_lm("llama", seed=0)[0], lora_config=LORA)
    for p in (policy, plain):
        p.logits(ids, mask).logsumexp(-1).mean().backward()
    assert_close(policy.logits(ids, mask), plain.logits(ids, mask), **tl.FORWARD)
    for a, b in zip(policy.trainable_parameters(), plain.trainable_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert_close(a.grad, b.grad, **tl.GRADS)


def test_quantization_needs_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this checks the message on machines without CUDA")
    model, _ = tiny_causal_lm("qwen2", seed=0)
    model.save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        rl_adapters.PolicyModel.from_pretrained(
            str(tmp_path / "base"), quantization_config=object(), lora_config=LORA
        )


@pytest.mark.parametrize(
    ("saved_cfg", "model_cfg"),
    [
        ((4, 8, ["q_proj", "v_proj"]), (8, 16, ["q_proj", "k_proj"])),  # model larger
        ((8, 4, ["q_proj", "v_proj"]), (2, 4, ["v_proj"])),  # checkpoint larger
    ],
)
def test_merge_lora_config_pads_rank_and_unions_targets(
    tmp_path: Path, saved_cfg: tuple[int, int, list[str]], model_cfg: tuple[int, int, list[str]]
) -> None:
    def policy(r: int, alpha: int, targets: list[str], seed: int) -> rl_adapters.PolicyModel:
        cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
        model, _ = tiny_causal_lm("qwen2", seed=0)
        return rl_adapters.PolicyModel(model, lora_config=cfg, seed=seed)

    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    saved = policy(*saved_cfg, seed=0)
    _train_step(saved, ids)  # non-zero B, so the merged model must really carry the weights
    ckpt.save_checkpoint(saved, tmp_path / "ck")
    target = policy(*model_cfg, seed=1)
    with pytest.raises(rl_adapters.CheckpointError, match="LoRA config mismatch") as info:
        rl_adapters.load_checkpoint(target, tmp_path / "ck")
    assert '"r": ' in str(info.value)  # both configs are shown
    rl_adapters.load_checkpoint(target, tmp_path / "ck", merge_lora_config=True)
    assert target.lora_config is not None
    assert target.lora_config.r == max(saved_cfg[0], model_cfg[0])
    assert set(target.lora_config.target_modules) == set(saved_cfg[2]) | set(model_cfg[2])
    with torch.no_grad():
        for role in target.roles:
            # another LoRA rank (zero-padded): another matmul shape, two routes
            assert_close(
                target.logits(ids, mask, role), saved.logits(ids, mask, role), **tl.FORWARD
            )
    assert all(p.requires_grad for p in target.trainable_parameters())
