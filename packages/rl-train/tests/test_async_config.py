"""The ``async:`` section and the asynchronous loop's argument checks, and a stalled worker.

The other runs with a real rollout worker process are in ``tests_integration/test_async.py``.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
from rl_train.async_loop import AsyncReasoningSource, check_async_agent
from rl_train.builder import rollout_pieces
from rl_train.cli import EXIT_USAGE, main
from rl_train.config import AsyncConfig, ConfigError, load_config, to_dict
from rl_train.demo import DemoConfig, build_agent
from rl_train.loops import finetune_llm_reasoning
from rl_train.tiny import tiny_model, tiny_tokenizer


def test_the_async_section_is_read_from_yaml_and_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: grpo\nasync:\n  max_staleness: 2\n  strategy: drop\n")
    config = load_config(cfg, ["async.queue_size=3", "async.timeout_s=30"])
    assert config.async_ == AsyncConfig(
        max_staleness=2, strategy="drop", queue_size=3, timeout_s=30.0
    )
    assert to_dict(config)["async"]["max_staleness"] == 2 and "async_" not in to_dict(config)
    assert load_config(None).async_ is None
    cfg.write_text("algo: grpo\nasync: null\n")
    assert load_config(cfg).async_ is None
    assert load_config(None, ["async.max_staleness=0"]).async_ == AsyncConfig(max_staleness=0)
    cfg.write_text("algo: grpo\nmodel: null\n")  # a required section cannot be null
    with pytest.raises(ConfigError, match="model must be a mapping, got NoneType"):
        load_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async.max_staleness=-1"], "async.max_staleness must be an integer >= 0, got -1"),
        (["async.strategy=later"], "async.strategy must be 'drop' or 'wait', got 'later'"),
        (
            ["async.max_staleness=0", "async.weight_sync_steps=3"],
            "set max_staleness >= 2 or lower weight_sync_steps",
        ),
        (["async.queue_size=0"], "async.queue_size must be >= 1, got 0"),
        (["async.timeout_s=0"], "async.timeout_s must be > 0 seconds"),
        (["async.max_stalenes=1"], "did you mean 'async.max_staleness'?"),
        (["algo=ppo", "async.max_staleness=1"], "async: algo ppo cannot train asynchronously"),
        (["algo=ilql", "async.max_staleness=1"], "async: algo ilql learns offline"),
        (["engine=vllm", "async.max_staleness=1"], "async: the rollout worker runs the hf engine"),
        (["async_.max_staleness=1"], "unknown key 'async_'"),
        (["async.engine_url=localhost:8000"], "async.engine_url must look like 'http://host:port'"),
    ],
)
def test_bad_async_settings_are_one_line_exit_2(
    overrides: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  name: tiny\n")
    assert main(["run", str(cfg), *overrides, "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def _agent(algo: str = "grpo") -> object:
    tok = tiny_tokenizer()
    return build_agent(DemoConfig(algo=algo), tiny_model(len(tok)), tok)


def test_the_python_api_refuses_what_async_cannot_train() -> None:
    with pytest.raises(ValueError, match="`async_config` needs `rollout_factory`"):
        finetune_llm_reasoning([], None, async_config=AsyncConfig())
    with pytest.raises(ValueError, match="must be picklable"):
        AsyncReasoningSource(lambda: None, AsyncConfig())  # type: ignore[arg-type,return-value]
    source = AsyncReasoningSource(
        functools.partial(rollout_pieces, DemoConfig().run_config()), AsyncConfig()
    )
    grpo = _agent()
    with pytest.raises(ValueError, match="async training takes one agent, got a population of 2"):
        source.start([grpo, grpo], None)
    with pytest.raises(ValueError, match=r"algo ppo cannot train asynchronously.*use grpo"):
        source.start([_agent("ppo")], None)
    check_async_agent([grpo])
    assert source.process is None  # nothing started before the first step
    from peft import LoraConfig
    from rl_algos import make_agent
    from rl_train.tiny import TINY_AGENT

    tok = tiny_tokenizer()
    lora = make_agent(
        "grpo", actor_network=tiny_model(len(tok)), tokenizer=tok, group_size=4,
        lora_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
        pad_token_id=tok.pad_token_id, pad_token=tok.pad_token, **TINY_AGENT,
    )  # fmt: skip
    remote = AsyncReasoningSource(
        functools.partial(rollout_pieces, DemoConfig().run_config()),
        AsyncConfig(engine_url="http://127.0.0.1:8000"),
    )
    remote.start([lora], None)  # LoRA on a rollout server: the adapter is synced (issue 45)
    assert remote.process is None


def test_stale_batches_without_a_correction_warn_and_clip_against_sampler_counts() -> None:
    source = AsyncReasoningSource(
        functools.partial(rollout_pieces, DemoConfig().run_config()), AsyncConfig(max_staleness=1)
    )
    agent = _agent()
    agent.config.vllm_importance_sampling_correction = False
    with pytest.warns(RuntimeWarning, match="clip_against_sampler=True"):
        source.start([agent], None)
    agent.config.clip_against_sampler = True
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        source.start([agent], None)  # the clip against the sampler handles stale batches


def test_a_stalled_worker_is_an_error_naming_it_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """A worker that never sends a batch (here: stuck building its pieces) stops the run within
    ``startup_timeout_s`` with an error naming it; its process is gone, and so is the thread that
    fed it the weights it never read (a copy of the weights, held until the trainer exits)."""
    import multiprocessing
    import threading

    import worker_testlib
    from rl_train.async_loop import RolloutWorkerError
    from rl_train.demo import build_env

    before = set(threading.enumerate())
    agent = _agent()
    config = AsyncConfig(max_staleness=1, startup_timeout_s=0.5)
    message = (
        r"rollout worker \(rl-train-rollout-worker, pid \d+\) sent no batch for 0.5 s \(step 1\)"
    )
    with pytest.raises(RolloutWorkerError, match=message):
        finetune_llm_reasoning([agent], build_env(DemoConfig(), agent.tokenizer), max_steps=2,
                               run_dir=tmp_path, verbose=False, plot=False, tensorboard=False,
                               async_config=config, rollout_factory=worker_testlib.stalled_factory)  # fmt: skip
    assert not multiprocessing.active_children()
    feeders = [t for t in set(threading.enumerate()) - before if t.name == "QueueFeederThread"]
    for feeder in feeders:  # a closed queue's feeder ends on its own once its pipe is read out;
        feeder.join(120.0)  # a hang guard, never a speed limit: a blocked one never ends
    assert not [t for t in feeders if t.is_alive()]


@pytest.mark.slow  # the trainer stalls past the worker's former 30 s limit: `nox -s slow`
def test_a_worker_that_fails_while_the_trainer_is_slow_still_reports_its_traceback(
    tmp_path: Path,
) -> None:
    """The worker fails while its queue is full and the trainer is in a long step (here held
    for 35 s at step 1): its traceback still reaches the trainer's error, however long the step;
    it used to give up after 30 s and exit, and the error said only "exited with code 1"."""
    import functools
    import threading

    import worker_testlib
    from rl_train.async_loop import RolloutWorkerError
    from rl_train.builder import build

    config = DemoConfig(steps=6, n_train=80, n_test=8, prompts_per_step=4, group_size=4)
    run_config = config.run_config(tmp_path / "r")
    built = build(run_config, distributed=False)
    release = threading.Event()

    def slow_step(row: dict[str, float]) -> None:
        if row["step"] == 1:
            release.wait(35.0)  # a long training step (never set: the wait runs out)

    try:
        with pytest.raises(RolloutWorkerError) as info:
            finetune_llm_reasoning(
                [built.agent], built.env, max_steps=6, run_dir=tmp_path / "r", verbose=False,
                plot=False, tensorboard=False, log_fn=slow_step,
                async_config=AsyncConfig(max_staleness=1, queue_size=1),
                rollout_factory=functools.partial(worker_testlib.failing_factory, run_config, 2),
            )  # fmt: skip
    finally:
        release.set()
    message = str(info.value)
    assert "failed; its traceback" in message, message
    assert "injected reward failure at batch 3" in message, message
