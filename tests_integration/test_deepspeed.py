"""DeepSpeed ZeRO-2 and ZeRO-3 (LoRA) on CPU: 2 processes over gloo, launched with torchrun.

The agent gets ``Accelerator(deepspeed_plugin=..., kwargs_handlers=[InitProcessGroupKwargs(
backend="gloo")])``, the configuration that really distributes on CPU (platform-notes.md). The
launched processes skip DeepSpeed's shared-memory op, which serves only inference and which
DeepSpeed would otherwise JIT-build in every fresh environment (``scripts/ds_cpu.py``). Marked
slow: ``nox -s slow`` (also in CI).

Measured (2 cores): ZeRO-2 and ZeRO-3 weights after 3 steps within 1.4e-6 (abs) of one process
on the global batch, grad norms equal to 7 digits, ranks bit-identical.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rl_testing.tolerance import assert_close
from safetensors.torch import load_file

SCRIPTS = Path(__file__).resolve().parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

pytestmark = pytest.mark.slow


#: The modes of ``scripts/ds_learn.py`` each ZeRO stage runs, all in one launch (one process
#: start per rank: importing DeepSpeed, peft and transformers is most of a launch's time on a
#: small CPU). The tests of a launch share it (one xdist group, one module fixture); each checks
#: its mode's files.
LAUNCHES = {2: ["lora", "packed"], 3: ["lora", "nan", "full", "checkpointed", "moe", "packed"]}


def launch(out: Path, stage: int, modes: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}  # it drops DeepSpeed
    env["OMP_NUM_THREADS"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port),
           str(SCRIPTS / "ds_learn.py"), str(out), str(stage), ",".join(modes)]  # fmt: skip
    # a hang guard: a start, then each mode (about 20 s each on 2 busy cores)
    timeout = 240 + 120 * len(modes)
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


#: Each stage's launch in this process: its output directory, or the launch's failure.
_LAUNCHED: dict[int, Path | AssertionError] = {}


@pytest.fixture
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, str], Path]:
    """``(stage, mode) -> the mode's output directory``: launches each stage's modes once per
    process (:data:`LAUNCHES`; kept at module level: xdist tears fixtures of any scope down
    whenever a worker has no next test queued); a failed launch fails every test of it with its
    output."""

    def get(stage: int, mode: str) -> Path:
        if stage not in _LAUNCHED:
            out = tmp_path_factory.mktemp(f"zero{stage}")
            try:
                launch(out, stage, LAUNCHES[stage])
                _LAUNCHED[stage] = out
            except AssertionError as exc:
                _LAUNCHED[stage] = exc
        result = _LAUNCHED[stage]
        if isinstance(result, AssertionError):
            raise AssertionError(f"the ZeRO-{stage} launch failed: {result}")
        return result / mode

    return get


ZERO2 = pytest.mark.xdist_group("zero2")
ZERO3 = pytest.mark.xdist_group("zero3")


def rank_files(out: Path, step: int) -> list[dict[str, torch.Tensor]]:
    ranks = [load_file(str(out / f"rank{r}_step{step}.safetensors")) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for name in ranks[0].keys() - {"loss", "grad_norm", "route_flips"}:
        # bit-exact: the ranks' replicas take the same all-reduced gradient, the same step
        assert torch.equal(ranks[0][name], ranks[1][name]), (step, name)
    return ranks


def assert_matches_one_process(out: Path, skip: tuple[int, ...] = (), **agent: Any) -> None:
    """Each step equals one process's learn() on the whole global batch (to float32 rounding:
    ``ddp_common.assert_step_matches``)."""
    from ddp_common import (
        DS_AGENT,
        STEPS,
        assert_step_matches,
        assert_weights_match,
        global_batches,
        make_agent,
    )

    torch.set_num_threads(1)
    single = make_agent(**DS_AGENT, **agent)
    for step, (ids, masks, rewards, _) in enumerate(global_batches()):
        ranks = rank_files(out, step)
        if step in skip:
            assert float(ranks[0]["skipped"]) == 1.0 and float(ranks[1]["skipped"]) == 1.0
            assert math.isnan(float(ranks[0]["loss"]))
            assert_weights_match(step - sum(s <= step for s in skip), ranks[0], single)
            continue
        assert float(ranks[0]["skipped"]) == 0.0
        metrics = single.learn((ids, masks, rewards))
        losses = [float(ranks[0]["loss"]), float(ranks[1]["loss"])]
        taken = step - sum(s < step for s in skip)  # the optimiser steps taken before this one
        assert_step_matches(taken, losses, metrics, ranks[0], single, float(ranks[0]["grad_norm"]))
    assert step == STEPS - 1


@ZERO2
def test_zero2_two_processes_equal_one_process(launched: Callable[[int, str], Path]) -> None:
    assert_matches_one_process(launched(2, "lora"))


@ZERO3
def test_zero3_lora_equals_one_process_and_its_checkpoint_loads_in_one_process(
    launched: Callable[[int, str], Path],
) -> None:
    out = launched(3, "lora")
    assert_matches_one_process(out)

    from ddp_common import global_batches, make_agent
    from rl_algos import GRPO
    from rl_testing.models import tiny_causal_lm

    reference = make_agent()  # supplies the LoRA config and a fresh base
    model, _ = tiny_causal_lm("qwen2", seed=0)
    loaded = GRPO.load(
        out / "ckpt",
        actor_network=model,
        lora_config=reference.policy.peft.peft_config["actor"],
    )
    assert loaded.steps == 3
    ids = global_batches()[0][0][:4]
    with torch.no_grad():
        logits = loaded.policy.causal_lm(input_ids=ids).logits
    saved = load_file(str(out / "logits.safetensors"))["logits"]
    # the ZeRO-3 run's forward (partitioned modules) against one process's on the loaded
    # weights: 2 decoder layers and the head, the longest sum the MLP's 128
    assert_close(logits, saved, reduction=128, stages=3, msg="logits")
    # and the training changed them: the checkpoint is not the untrained model
    with torch.no_grad():
        untrained = reference.policy.causal_lm(input_ids=ids).logits
    assert float((untrained - saved).abs().max()) > 1e-3


@ZERO3
def test_zero3_nan_on_one_rank_mid_accumulation_never_reaches_the_weights(
    launched: Callable[[int, str], Path],
) -> None:
    """Rank 1's second micro-batch of step 1 turns NaN after the first was back-propagated.

    Both ranks skip the step (skip_nonfinite), the partial gradient is discarded, and the run
    continues exactly like one process that never saw batch 1.
    """
    assert_matches_one_process(launched(3, "nan"), skip=(1,))


@ZERO3
def test_zero3_full_finetuning_equals_one_process(launched: Callable[[int, str], Path]) -> None:
    """Full fine-tuning: ZeRO-3 partitions the trainable (tied) lm_head, which then goes through
    the module's own forward instead of the fused kernel."""
    # The largest weight difference (1.7e-5 after 3 steps here, 5.9e-5 on an AVX2 machine) is
    # in k_proj.bias, whose exact gradient is 0 (softmax ignores a shift shared by all keys):
    # Adam scales its float32 rounding noise up to a step of its own, bounded by lr per step.
    assert_matches_one_process(launched(3, "full"), full_finetune=True, lora_config=None)


@ZERO3
def test_zero3_gradient_checkpointing_equals_one_plain_process(
    launched: Callable[[int, str], Path],
) -> None:
    """Checkpointed layers under ZeRO-3 (issue 37): the recomputation gathers the partitioned
    weights again inside the backward, and the update equals one process without
    checkpointing."""
    assert_matches_one_process(launched(3, "checkpointed"))


@ZERO3
def test_zero3_mixture_of_experts_with_its_balance_loss_equals_one_plain_process(
    launched: Callable[[int, str], Path],
) -> None:
    """A tiny Qwen3-MoE under ZeRO-3 (its experts partitioned), with the load-balancing loss
    over the rows of both ranks and checkpointed layers, equals one process without
    checkpointing: the router logits read under ZeRO-3 carry their gradient. Two epochs, the
    second replaying the routes of the old forward (R2) inside ZeRO-3's gathered layers and
    their recomputation."""
    from ddp_common import MOE_AGENT, STEPS
    from packaging.version import Version
    from rl_algos.refusals import DEEPSPEED_ZERO3_MOE_CHECKPOINTING

    out = launched(3, "moe")
    installed = importlib.metadata.version("deepspeed")
    if Version(installed) < Version(DEEPSPEED_ZERO3_MOE_CHECKPOINTING):  # the floor's 0.16.4
        # it recomputes the checkpointed layers with their weights partitioned: refused
        refused = (out / "refused.txt").read_text()
        assert (
            f"needs deepspeed>={DEEPSPEED_ZERO3_MOE_CHECKPOINTING} (installed: {installed})"
            in refused
        )
        assert not list(out.glob("rank*"))
        return
    single = {k: v for k, v in MOE_AGENT.items() if k != "gradient_checkpointing"}
    assert_matches_one_process(out, **single)
    for step in range(STEPS):  # the second epoch's routes moved: the replay forced the old ones
        assert all(float(rank["route_flips"]) > 0 for rank in rank_files(out, step)), step


@pytest.mark.parametrize("stage", [pytest.param(2, marks=ZERO2), pytest.param(3, marks=ZERO3)])
def test_packed_token_budget_equals_one_padded_process(
    launched: Callable[[int, str], Path], stage: int
) -> None:
    """Padding-free training under DeepSpeed (issue 20): packed rows in token-budget
    micro-batches (the ranks need different numbers of them; every rank runs as many as the one
    that needs the most, which ZeRO-3's collective forwards require) equal one padded process
    on the global batch."""
    assert_matches_one_process(launched(stage, "packed"))


def test_rl_train_run_with_a_deepspeed_config_under_torchrun(tmp_path: Path) -> None:
    """The command line as users launch it: ``torchrun -m rl_train run CONFIG deepspeed_config=``
    (through ``scripts/ds_cpu.py``, which runs ``-m rl_train`` without DeepSpeed's inference-only
    shared-memory op)."""
    import json

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}))
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env["OMP_NUM_THREADS"] = "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    examples = Path(__file__).resolve().parents[1] / "examples"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port),
           str(SCRIPTS / "ds_cpu.py"), "-m", "rl_train", "run", str(examples / "grpo_tiny.yaml"),
           f"deepspeed_config={ds}",
           "train.steps=4", "train.evaluation_interval=2", "train.checkpoint_steps=2",
           f"train.run_dir={run_dir}", "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.stdout.count("greedy accuracy after training") == 1  # the main process only
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 4
    assert json.loads((run_dir / "config.json").read_text())["deepspeed_config"] == str(ds)
