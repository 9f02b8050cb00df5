"""Data-parallel training on CPU, launched as users launch it (torchrun + accelerate, gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPTS = Path(__file__).resolve().parent / "scripts"
sys.path.insert(0, str(SCRIPTS))


def launch(
    out: Path,
    *extra: str,
    timeout: float = 300,
    script: str = "ddp_learn.py",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", **(env or {})}
    with socket.socket() as s:  # torchrun's --master_port 0 hangs: pick a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port),
           str(SCRIPTS / script), str(out), *extra]  # fmt: skip
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


#: The options that choose what is trained (the one process trains the same model); the others
#: change only how the ranks compute, and the one process runs the plain path.
SINGLE_OPTIONS = (
    "arch", "full_finetune", "lora_config", "router_aux_loss_coef", "router_replay",
    "update_epochs",
)  # fmt: skip


#: The agent options of the two-process runs, all run in one launch (``ddp_learn.py``'s
#: ``DDP_RUNS``): one process start per rank instead of one per case.
OPTIONS = {
    "padded": {},
    "packed-tokens16": {"use_sequence_packing": True, "micro_batch_tokens": 16},
    "checkpointed": {"gradient_checkpointing": True, "use_sequence_packing": False},
    "checkpointed-packed-tokens16": {
        "gradient_checkpointing": True,
        "use_sequence_packing": True,
        "micro_batch_tokens": 16,
    },
    # the experts and the router train: each rank's tokens reach other experts; the
    # load-balancing loss over the rows of both ranks (weighted 1: as large as the policy's);
    # two epochs, the second replaying each rank's routes of the old forward (R2)
    "moe-full": {
        "arch": "qwen3_moe",
        "full_finetune": True,
        "lora_config": None,
        "router_aux_loss_coef": 1.0,
        "router_replay": "R2",
        "update_epochs": 2,
    },
}
#: The launch of :data:`OPTIONS` in this process: its output directory, or its failure (kept at
#: module level: xdist tears fixtures of any scope down whenever a worker has no next test).
_LAUNCHED: list[Path | AssertionError] = []


@pytest.fixture
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of the one launch of :data:`OPTIONS` (launched on first use)."""
    if not _LAUNCHED:
        out = tmp_path_factory.mktemp("ddp-options")
        # a hang guard: a start, then each run (about 10 s each on 2 busy cores)
        proc = launch(out, timeout=240 + 60 * len(OPTIONS), env={"DDP_RUNS": json.dumps(OPTIONS)})
        ok = proc.returncode == 0
        _LAUNCHED.append(out if ok else AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:]))
    if isinstance(_LAUNCHED[0], AssertionError):
        raise AssertionError(f"the launch of every option failed: {_LAUNCHED[0]}")
    return _LAUNCHED[0]


@pytest.mark.xdist_group("ddp-options")  # the tests share one launch
@pytest.mark.parametrize("name", list(OPTIONS))
def test_two_process_grpo_equals_one_process_on_the_global_batch(launched: Path, name: str) -> None:
    """Also packed, in token-budget micro-batches (issue 20): the ranks' rows need different
    numbers of micro-batches, every rank runs as many as the one that needs the most, and the
    weights still match one padded process on the global batch. Also with gradient
    checkpointing (issue 37): DDP's gradient hooks fire inside the checkpoints' recomputation."""
    from ddp_common import STEPS, assert_step_matches, global_batches, make_agent

    options, out = OPTIONS[name], launched / name
    torch.set_num_threads(1)
    single = make_agent(**{k: v for k, v in options.items() if k in SINGLE_OPTIONS})
    for step, (ids, masks, rewards, _) in enumerate(global_batches()):
        metrics = single.learn((ids, masks, rewards))
        ranks = [load_file(str(out / f"rank{r}_step{step}.safetensors")) for r in (0, 1)]
        assert ranks[0].keys() == ranks[1].keys()
        for key in ranks[0].keys() - {"loss"}:
            # bit-exact: DDP replicas take the same all-reduced gradient, the same step
            assert torch.equal(ranks[0][key], ranks[1][key]), (step, key)
        # the summed per-rank losses are the global loss; weights match one process on it
        losses = [float(ranks[0]["loss"]), float(ranks[1]["loss"])]
        assert_step_matches(step, losses, metrics, ranks[0], single)
        if options.get("router_replay"):  # the second epoch replaced routes: replay mattered
            assert metrics["route_flips"] > 0, step
    assert step == STEPS - 1


def test_a_rank_that_raises_ends_the_run_with_an_error_not_a_hang(tmp_path: Path) -> None:
    """Rank 1 raises at step 1 while rank 0 waits in a collective: torchrun tears both down."""
    try:
        proc = launch(tmp_path, "1")  # launch's timeout (300 s) is a hang guard, not a speed limit
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the run hung: no exit {exc.timeout:.0f} s after the launch (hang guard)")
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stdout + proc.stderr
    # rank 1 failed after step 0, and rank 0 did not go on alone past the collective of step 1
    assert (tmp_path / "rank1_step0.safetensors").is_file()
    assert not list(tmp_path.glob("rank*_step[1-9]*.safetensors"))


def test_finetune_loop_under_ddp_writes_once_and_its_checkpoint_loads(tmp_path: Path) -> None:
    """``finetune_llm_reasoning`` on 2 processes: ranks stay identical; process 0 alone
    writes the metrics (means over processes), the curve and the checkpoints."""
    proc = launch(tmp_path, script="ddp_finetune.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1)]
    for name, value in ranks[0].items():
        assert torch.equal(value, ranks[1][name]), name  # bit-exact: DDP replicas, same steps
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # once, not once per process
    assert "fitness" in rows[2] and "fitness" in rows[5]
    assert (tmp_path / "reward_curve.png").is_file()
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == 6

    from rl_algos import GRPO
    from rl_train.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    loaded = GRPO.load(
        tmp_path / "checkpoints" / latest["name"] / "agent_0",
        actor_network=tiny_model(len(tokenizer), seed=0),
        tokenizer=tokenizer,
    )
    assert loaded.steps == 6
    for name, p in loaded.policy.named_parameters():
        assert torch.equal(p.detach(), ranks[0][name]), name  # bit-exact: a save/load round trip


@pytest.mark.slow
def test_finetune_loop_under_ddp_resumes_exactly(tmp_path: Path) -> None:
    """3 steps, stop, resume to 6: the same weights and metrics as 6 uninterrupted steps.

    Each process reloads its own saved environment state (``env_rank<r>.json``); with
    ``ReasoningGym``'s sharding the processes' states hold the same shard-local indices, so
    this checks the collective save/resume path rather than telling the files apart."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for out, args in ((whole, ["6"]), (parts, ["3"]), (parts, ["6", "resume"])):
        out.mkdir(exist_ok=True)
        proc = launch(out, *args, script="ddp_finetune.py")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in (0, 1):
        a = load_file(str(whole / f"rank{r}.safetensors"))
        b = load_file(str(parts / f"rank{r}.safetensors"))
        for name, value in a.items():
            assert torch.equal(value, b[name]), (r, name)  # bit-exact: the resume replays the run
    rows = [(whole / "metrics.jsonl").read_text(), (parts / "metrics.jsonl").read_text()]
    keep = ("step", "mean_reward", "loss", "fitness")
    a_rows, b_rows = (
        [{k: v for k, v in json.loads(x).items() if k in keep} for x in t.splitlines()]
        for t in rows
    )
    assert a_rows == b_rows
