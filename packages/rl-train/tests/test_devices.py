"""``rl-train run`` on every device: training, evaluation, checkpoints and resuming.

The run configuration users write (``examples/grpo_tiny.yaml`` with ``agent.device``), through the
command line in-process, on the device from ``rl_testing.devices``: CPU here, CUDA under
``pytest -m cuda`` / ``nox -s gpu``. On CUDA this is the one test that drives the whole loop
there: the environment's CPU tensors meet the agent's device, evaluation generates greedily on
it, and a checkpoint saves and restores the CUDA random state next to the weights.
(``test_loops.py`` checks, on CPU, that a resumed run equals an uninterrupted one bit for bit;
CUDA's attention backward is not deterministic, so here the resumed run is checked by its
steps, its finite metrics and its weights.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rl_testing.devices import DEVICES
from rl_train import MetricsLogger
from rl_train.cli import main
from rl_train.tiny import tiny_model, tiny_tokenizer

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny.yaml"


@pytest.mark.parametrize("device", DEVICES)
def test_rl_train_run_trains_evaluates_and_resumes_on_the_device(
    device: str, tmp_path: Path
) -> None:
    # rl-train's own dependencies (the built-in tasks are datasets; the reward curve): always
    # here, but a bare GPU image that runs the workspace from source (tools/gpu/run.py) may lack
    # them; TensorBoard is left out (train.report_to=none)
    for module in ("datasets", "matplotlib"):
        pytest.importorskip(module, reason=f"rl-train's dependency `{module}` is not installed")
    run_dir = tmp_path / "run"
    common = [
        "run", str(EXAMPLE), f"agent.device={device}", f"train.run_dir={run_dir}",
        "train.evaluation_interval=2", "train.checkpoint_steps=2", "data.n_train=64",
        "data.n_test=8", "train.report_to=none",
    ]  # fmt: skip
    assert main([*common, "train.steps=2", "--quiet"]) == 0
    first = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert first["step"] == 2
    step_2 = run_dir / "checkpoints" / first["name"]
    written = {f: f.stat().st_mtime_ns for f in step_2.rglob("*") if f.is_file()}
    assert main([*common, "train.steps=4", "train.resume=true", "--quiet"]) == 0

    rows = MetricsLogger.read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the second run continued from step 2 (a fresh one would have rewritten its checkpoint)
    assert {f: f.stat().st_mtime_ns for f in step_2.rglob("*") if f.is_file()} == written
    for row in rows:
        assert math.isfinite(row["loss"]), row
    evaluated = [r for r in rows if "eval_accuracy" in r]
    assert [r["step"] for r in evaluated] == [2, 4], rows[-1].keys()
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == 4
    assert (run_dir / "reward_curve.png").is_file()

    # the checkpoint loads onto the device, and its weights are the trained ones
    from rl_algos import GRPO

    tok = tiny_tokenizer()
    agent = GRPO.load(
        run_dir / "checkpoints" / latest["name"] / "agent_0", actor_network=tiny_model(len(tok), 0),
        device=device,
    )  # fmt: skip
    assert agent.steps == 4
    params = list(agent.actor_parameters())
    assert params and all(p.device.type == torch.device(device).type for p in params)
    untrained = dict(tiny_model(len(tok), 0).named_parameters())
    moved = [
        n for n, p in agent.policy.causal_lm.named_parameters()
        # bit-exact: a weight no step touched keeps its bits; a trained one moves by far more
        if n in untrained and not torch.equal(p.detach().cpu(), untrained[n].detach())
    ]  # fmt: skip
    # a step whose rewards are all equal has no gradient: the seeded CPU run has unequal
    # rewards in its first step; on CUDA (other samples) all 256 could be 0, rarely
    learned = any(r["grad_norm"] > 0 for r in rows)
    assert learned or device != "cpu", rows
    assert moved or not learned, "the checkpoint holds the untrained weights"


@pytest.mark.parametrize("device", DEVICES)
def test_multiturn_ppo_trains_on_the_device(device: str, tmp_path: Path) -> None:
    """``finetune_llm_multiturn`` with LLMPPO on the device: the environment's CPU token
    observations meet the agent's device, per-turn rewards go to the critic's turn-level GAE."""
    from rl_envs import TokenObservationWrapper
    from rl_envs.tasks import GuessTheNumberEnv
    from rl_train import finetune_llm_multiturn
    from rl_train.builder import build_agent
    from rl_train.demo import DemoConfig

    tok = tiny_tokenizer()
    config = DemoConfig(algo="ppo", prompts_per_step=2, group_size=2, max_model_len=160)
    run = config.run_config()
    run.agent["device"] = device
    agent = build_agent(run, tiny_model(len(tok), 0), tok)

    def env_factory() -> TokenObservationWrapper:
        return TokenObservationWrapper(GuessTheNumberEnv(0, 3, max_guesses=3), tok, max_turns=3,
                                       pad_id=tok.pad_token_id, max_model_len=128,
                                       max_output_tokens=2)  # fmt: skip

    finetune_llm_multiturn([agent], max_turns=3, env_factory=env_factory, max_steps=2,
                           evaluation_interval=2, batch_size=2, group_size=2, run_dir=tmp_path,
                           verbose=False, report_to="none", plot=False)  # fmt: skip
    rows = MetricsLogger.read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in rows), rows
    assert "fitness" in rows[-1] and "value_loss" in rows[0], rows[0].keys()
    assert agent.steps >= 2
    params = [p for p in agent.policy.parameters() if p.requires_grad]
    assert params and all(p.device.type == torch.device(device).type for p in params)
