"""``rl-train run`` / ``rl-train eval``: build model, data, agent from a :class:`RunConfig`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rl_train.config import ConfigError, RunConfig, to_dict

__all__ = [
    "build_accelerator",
    "build_agent_from_config",
    "build_env_from_config",
    "build_model",
    "evaluate",
    "load_offline_data",
    "train",
]


def build_accelerator(config: RunConfig) -> Any:
    """An ``accelerate.Accelerator`` under a launcher or with ``deepspeed_config``; else None.

    Launched by ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` is set), the agent and the
    environment share it: DDP (gloo on CPU, nccl on GPUs), or DeepSpeed with the JSON config.
    On CPU the process group is gloo explicitly, without which accelerate silently runs one
    process, and DeepSpeed is not dropped (``Accelerator(cpu=True)`` would drop it).

    Raises:
        ConfigError: ``deepspeed_config`` without a launcher, or a file that is not JSON.
    """
    launched = "WORLD_SIZE" in os.environ
    if config.deepspeed_config is None and not launched:
        return None
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    if config.deepspeed_config is None:
        return Accelerator(cpu=not cuda)
    if not launched:
        raise ConfigError(
            "deepspeed_config needs a launcher: torchrun --nproc_per_node N -m rl_train run "
            "CONFIG.yaml (or accelerate launch --num_processes N -m rl_train run ...)"
        )
    path = Path(config.deepspeed_config)
    try:
        ds = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"deepspeed_config {str(path)!r} is not a readable JSON file: {exc}"
        ) from exc
    handlers = [] if cuda else [InitProcessGroupKwargs(backend="gloo")]
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds), kwargs_handlers=handlers)


def build_model(config: RunConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the embedded tiny pair, or a hub/local causal LM."""
    if config.model.name == "tiny":
        from rl_train.demo import tiny_model, tiny_tokenizer

        tiny_tok = tiny_tokenizer()
        return tiny_model(len(tiny_tok), seed=config.train.seed), tiny_tok
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if config.model.dtype not in dtypes:
        raise ConfigError(
            f"model.dtype must be one of {sorted(dtypes)}, got {config.model.dtype!r}"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            config.model.name, dtype=dtypes[config.model.dtype]
        )
        tok = AutoTokenizer.from_pretrained(config.model.tokenizer or config.model.name)
    except OSError as exc:
        raise ConfigError(
            f"cannot load model {config.model.name!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _reward(name: str) -> Any:
    from rl_envs.rewards import exact_match_reward, tagged_format_reward

    from rl_train.demo import demo_reward

    if name == "demo":
        return demo_reward
    if name == "exact_match":
        return exact_match_reward
    if name == "tagged":

        def tagged(completion: str, answer: str, question: str) -> float:
            fmt = tagged_format_reward(completion, ("answer",), 0.2)
            return exact_match_reward(completion, answer, question) + fmt

        return tagged
    raise ConfigError(f"data.reward must be demo, exact_match or tagged, got {name!r}")


def build_env_from_config(config: RunConfig, tokenizer: Any, accelerator: Any = None) -> Any:
    """The ``ReasoningGym`` of ``config.data`` (sharded by process with ``accelerator``)."""
    from rl_envs import ReasoningGym
    from rl_envs.tasks import available_tasks, train_test_split_task

    d = config.data
    if d.hub is not None:
        from datasets import load_dataset

        ds = load_dataset(d.hub, d.hub_config)
        train, test = ds["train"], ds["test"]
    elif d.train_path is not None:
        from datasets import load_dataset

        kind = {"jsonl": "json", "json": "json", "csv": "csv"}.get(
            Path(d.train_path).suffix.lstrip(".")
        )
        if kind is None or not Path(d.train_path).is_file():
            raise ConfigError(
                f"data.train_path {d.train_path!r} must be an existing .json, .jsonl or .csv file"
            )
        train = load_dataset(kind, data_files=d.train_path)["train"]
        if d.test_path is not None:
            test = load_dataset(kind, data_files=d.test_path)["train"]
        else:
            cut = max(1, len(train) // 10)
            train, test = (
                train.select(range(len(train) - cut)),
                train.select(range(len(train) - cut, len(train))),
            )
    else:
        if d.task not in available_tasks():
            raise ConfigError(
                f"unknown task {d.task!r}; built-in tasks: {', '.join(available_tasks())}"
            )
        train, test = train_test_split_task(d.task, d.n_train, d.n_test, seed=config.train.seed)
    template = [{"role": "user", "content": d.template}]
    if d.system_prompt:
        template.insert(0, {"role": "system", "content": d.system_prompt})
    return ReasoningGym(
        train,
        test,
        tokenizer,
        _reward(d.reward),
        template,
        data_batch_size_per_gpu=d.prompts_per_step,
        seed=config.train.seed,
        question_column=d.question_column,
        answer_column=d.answer_column,
        accelerator=accelerator,
    )


def build_agent_from_config(
    config: RunConfig, model: Any, tokenizer: Any, accelerator: Any = None
) -> Any:
    """The agent of ``config.algo`` with ``config.agent``'s arguments over sensible defaults."""
    from peft import LoraConfig

    from rl_train.demo import TINY_AGENT, agent_factory

    kwargs: dict[str, Any] = dict(TINY_AGENT) if config.model.name == "tiny" else {}
    kwargs.update(config.agent)
    group = int(kwargs.get("group_size", 8))
    kwargs.setdefault("batch_size", config.data.prompts_per_step * group)
    common = {
        "actor_network": model,
        "pad_token_id": tokenizer.pad_token_id,
        "pad_token": tokenizer.pad_token,
        "tokenizer": tokenizer,
        "seed": config.train.seed,
        "use_vllm": config.engine == "vllm",
        "model_name": None if config.model.name == "tiny" else config.model.name,
        "accelerator": accelerator,
    }
    full = config.model.full_finetune or config.model.name == "tiny"
    if full and config.algo == "ppo":
        kwargs.setdefault("critic_mode", "shared")  # a LoRA critic needs a LoRA actor
    if full:
        common["full_finetune"] = True
    else:
        common["lora_config"] = LoraConfig(
            r=config.model.lora_r,
            lora_alpha=config.model.lora_alpha,
            target_modules=config.model.lora_target_modules,
            lora_dropout=0.0,
        )
    if config.algo in ("reinforce", "ppo"):
        kwargs.pop("group_size", None)
    try:
        return agent_factory(config.algo)(**common, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"agent: {exc}") from exc


def load_offline_data(path: str | Path) -> tuple[list[Any], list[float]]:
    """``(samples, rewards)`` from a JSONL file of ``{"sample": ..., "reward": ...}`` lines.

    Raises:
        ConfigError: A missing file, a line that is not such an object (the line is named).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.offline_path {str(path)!r} does not exist")
    samples: list[Any] = []
    rewards: list[float] = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sample, reward = row["sample"], float(row["reward"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"data.offline_path line {number}: expected "
                f'{{"sample": ..., "reward": number}}, got {line[:60]!r} ({exc})'
            ) from exc
        samples.append(tuple(sample) if isinstance(sample, list) else sample)
        rewards.append(reward)
    return samples, rewards


def _train_offline(config: RunConfig, verbose: bool) -> dict[str, Any]:
    """``algo: ilql``: learn from ``data.offline_path`` alone; evaluate on the task's test split."""
    from rl_train.demo import greedy_accuracy
    from rl_train.ilql import make_experience, offline_learning_loop

    if config.data.offline_path is None:
        raise ConfigError(
            "algo: ilql learns offline: set data.offline_path to a JSONL file of "
            '{"sample": ..., "reward": ...} lines (see examples/ilql_tiny.yaml)'
        )
    samples, rewards = load_offline_data(config.data.offline_path)
    run_dir = Path(config.train.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    model, tok = build_model(config)
    env = build_env_from_config(config, tok)
    agent = build_agent_from_config(config, model, tok)
    try:
        dataset = make_experience(samples, rewards, tok, max_length=agent.max_model_len or 2048)
    except ValueError as exc:
        raise ConfigError(f"data.offline_path: {exc}") from exc
    before = greedy_accuracy(agent, env)
    offline_learning_loop(
        agent,
        dataset,
        steps=config.train.steps,
        seed=config.train.seed,
        evaluation_interval=config.train.evaluation_interval,
        eval_fn=lambda a: {"eval_accuracy": greedy_accuracy(a, env)},
        run_dir=run_dir,
        checkpoint_steps=config.train.checkpoint_steps,
        verbose=verbose,
    )
    after = greedy_accuracy(agent, env)
    return {
        "accuracy_before": before,
        "accuracy_after": after,
        "run_dir": str(run_dir.resolve()),
        "main_process": True,
    }


def train(config: RunConfig, *, verbose: bool = True) -> dict[str, Any]:
    """Run the configured training; returns a summary (accuracy before/after, run_dir).

    Online algorithms train with :func:`rl_train.finetune_llm_reasoning` on the configured
    task or dataset; ``ilql`` learns from ``data.offline_path`` only.
    """
    if config.algo == "ilql":
        return _train_offline(config, verbose)
    from rl_train.demo import greedy_accuracy
    from rl_train.loops import finetune_llm_reasoning

    run_dir = Path(config.train.run_dir)
    accelerator = build_accelerator(config)
    if accelerator is None or accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    model, tok = build_model(config)
    env = build_env_from_config(config, tok, accelerator)
    agent = build_agent_from_config(config, model, tok, accelerator)
    before = greedy_accuracy(agent, env)
    finetune_llm_reasoning(
        [agent],
        env,
        max_steps=config.train.steps,
        evaluation_interval=config.train.evaluation_interval,
        checkpoint_steps=config.train.checkpoint_steps,
        max_reward=config.train.max_reward,
        run_dir=run_dir,
        resume=config.train.resume,
        verbose=verbose,
        eval_fn=lambda a: {"eval_accuracy": greedy_accuracy(a, env)},
    )
    after = greedy_accuracy(agent, env)
    return {
        "accuracy_before": before,
        "accuracy_after": after,
        "run_dir": str(run_dir.resolve()),
        "main_process": accelerator is None or bool(accelerator.is_main_process),
    }


def evaluate(config: RunConfig, checkpoint: str | Path) -> dict[str, float]:
    """Greedy accuracy and mean test reward of a checkpoint on the configured data."""
    from rl_train.demo import greedy_accuracy

    path = Path(checkpoint)
    if (path / "agent_0").is_dir():
        path = path / "agent_0"
    if not (path / "state.json").is_file():
        raise ConfigError(f"{str(checkpoint)!r} is not a checkpoint (no state.json)")
    model, tok = build_model(config)
    env = build_env_from_config(config, tok)
    agent = build_agent_from_config(config, model, tok)
    agent.load_checkpoint(path, load_optimizer=False)
    return {"accuracy": greedy_accuracy(agent, env), "test_reward": float(agent.test(env))}
