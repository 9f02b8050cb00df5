"""A trainer object in the spirit of trlX's ``BaseRLTrainer``, with a name registry.

An algorithm's trainer class is its row's ``trainer`` in the algorithm table
(:mod:`rl_algos.names`); :func:`register_trainer` adds trainers under other names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rl_algos.names import ALGORITHM_SPECS, ALGORITHMS, resolve_name

from rl_train.builder import build
from rl_train.config import ConfigError, RunConfig
from rl_train.loops import finetune_llm_reasoning

__all__ = [
    "AgentTrainer",
    "BaseRLTrainer",
    "available_trainers",
    "get_trainer",
    "make_trainer",
    "register_trainer",
]

#: The built-in algorithms that learn from their own generations.
ONLINE_ALGORITHMS = tuple(name for name in ALGORITHMS if ALGORITHM_SPECS[name].online)

RewardFn = Callable[..., Sequence[float]]
#: Trainers registered under names that are not algorithms (:func:`register_trainer`).
_TRAINERS: dict[str, type[BaseRLTrainer]] = {}


def _table_trainer(name: str) -> type[BaseRLTrainer] | None:
    """The trainer class of algorithm ``name``'s row, or None for a name outside the table."""
    spec = ALGORITHM_SPECS.get(name)
    return None if spec is None else resolve_name(spec.trainer, "rl_train")


def register_trainer(*names: str) -> Callable[[type[BaseRLTrainer]], type[BaseRLTrainer]]:
    """Class decorator: make a trainer available under ``names`` (``get_trainer(name)``).

    An algorithm's own trainer is its table row's ``trainer``; registering another class
    under an algorithm's name raises.
    """

    def decorator(cls: type[BaseRLTrainer]) -> type[BaseRLTrainer]:
        for name in names or (cls.__name__,):
            known = _TRAINERS.get(name) or _table_trainer(name)
            if known is not None and known is not cls:
                raise ValueError(f"a trainer named {name!r} is registered already")
            if name not in ALGORITHM_SPECS:
                _TRAINERS[name] = cls
        return cls

    return decorator


def get_trainer(name: str) -> type[BaseRLTrainer]:
    """The trainer class of algorithm ``name`` (its table row), or one registered under it."""
    trainer = _TRAINERS.get(name) or _table_trainer(name)
    if trainer is None:
        raise ValueError(f"unknown trainer {name!r}; known: {', '.join(available_trainers())}")
    return trainer


def available_trainers() -> list[str]:
    """Trainer names: every algorithm of the table and every registered name."""
    return sorted({*ALGORITHM_SPECS, *_TRAINERS})


class BaseRLTrainer:
    """Built from a :class:`RunConfig` plus optional trlX-style callables.

    Args:
        config: The run configuration (``rl_train.config.load_config``).
        reward_fn: trlX's ``reward_fn(samples, prompts, outputs, **kwargs) -> list[float]``;
            it also receives ``answers``. Replaces the config's reward.
        metric_fn: ``metric_fn(samples, prompts, outputs, **kwargs) -> dict[str, list[float]]``,
            logged by :meth:`evaluate`.
        logit_mask: [V] bool, tokens the policy may generate.
        stop_sequences: Strings that end a completion (cut by :meth:`decode`).
        train_mode: Accepted for trlX compatibility.
    """

    def __init__(
        self,
        config: RunConfig,
        reward_fn: RewardFn | None = None,
        metric_fn: Callable[..., dict[str, Sequence[float]]] | None = None,
        logit_mask: torch.Tensor | None = None,
        stop_sequences: Sequence[str] | None = None,
        train_mode: bool = False,
    ) -> None:
        del train_mode
        self.config = config
        self.reward_fn = reward_fn
        self.metric_fn = metric_fn
        self.stop_sequences = list(stop_sequences or [])
        self.logit_mask = logit_mask
        self.setup()

    def setup(self) -> None:
        """Build model, tokenizer, environment and agent (subclasses)."""
        raise NotImplementedError

    def learn(
        self,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
        save_fn: Callable[[Any], None] | None = None,
        eval_fn: Callable[[BaseRLTrainer], dict[str, float] | None] | None = None,
    ) -> None:
        """Train (subclasses)."""
        raise NotImplementedError


class AgentTrainer(BaseRLTrainer):
    """The trainer for every rl-algos agent: ``config.algo`` picks it."""

    def setup(self) -> None:
        """Build model, tokenizer, environment and agent from the config."""
        if self.config.env is not None:
            raise ConfigError(
                "env: the trlX-style trainers train on data:'s prompts and do not run an env: "
                "section's episodes; run the config with `rl-train run` (rl_train.run.prepare "
                "and fit), or remove env: to train on data:"
            )
        built = build(self.config, distributed=False)
        env = built.env
        assert env is not None  # built without an env: section
        self.model, self.tokenizer, self.env, self.agent = (
            built.model,
            built.tokenizer,
            env,
            built.agent,
        )
        if self.reward_fn is not None:
            fn = self.reward_fn

            def per_sample(completion: str, answer: str, question: str) -> float:
                out = fn(
                    samples=[question + completion],
                    prompts=[question],
                    outputs=[completion],
                    answers=[answer],
                )
                return float(out[0])

            per_sample.__name__ = getattr(fn, "__name__", "reward_fn")
            self.env.reward_fns, self.env.reward_weights = [per_sample], [1.0]
            self.env.reward_style = "agilerl"  # whatever data.reward_style said of the config's
        self.agent.stop_sequences = tuple(self.stop_sequences)
        self.agent.logit_mask = self.logit_mask

    def learn(
        self,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
        save_fn: Callable[[Any], None] | None = None,
        eval_fn: Callable[[BaseRLTrainer], dict[str, float] | None] | None = None,
    ) -> None:
        """Train with ``finetune_llm_reasoning``.

        The callbacks get each metrics row, each checkpoint directory, and this trainer at
        every evaluation (whose returned dict is logged).
        """
        t = self.config.train

        def evaluation(_: Any) -> dict[str, float]:
            stats = self.evaluate(show=False)
            if eval_fn is not None:
                stats.update(eval_fn(self) or {})
            return stats

        finetune_llm_reasoning(
            [self.agent],
            self.env,
            max_steps=t.steps,
            evaluation_interval=t.evaluation_interval,
            checkpoint_steps=t.checkpoint_steps,
            max_reward=t.max_reward,
            run_dir=t.run_dir,
            resume=t.resume,
            verbose=False,
            eval_fn=evaluation,
            log_fn=log_fn,
            save_fn=save_fn,
        )

    # -- generation --------------------------------------------------------------------------

    def _generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, training: bool
    ) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"`input_ids` must be [B, P], got {tuple(input_ids.shape)}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        prompts = [
            {"input_ids": r[None], "attention_mask": m[None]}
            for r, m in zip(input_ids, mask, strict=True)
        ]
        result = self.agent.get_action(prompts, training=training, repeat_prompts=False)
        width = max(c.shape[1] for c in result.completion_ids)
        pad = self.tokenizer.pad_token_id
        rows = [
            torch.nn.functional.pad(c, (0, width - c.shape[1]), value=pad)
            for c in result.completion_ids
        ]
        return torch.cat(rows)

    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """[B, P + T] sampled sequences (prompt without padding + completion)."""
        del kwargs
        return self._generate(input_ids, attention_mask, training=True)

    def generate_eval(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """[B, P + T] greedy sequences."""
        del kwargs
        return self._generate(input_ids, attention_mask, training=False)

    def decode(
        self,
        prompts: torch.Tensor | Sequence[Sequence[int]],
        samples: torch.Tensor | Sequence[Sequence[int]],
        prompt_sizes: Sequence[int] | None = None,
    ) -> tuple[list[str], list[str], list[str]]:
        """``(samples, prompts, outputs)`` as text; outputs are cut at the stop sequences."""
        sizes = (
            list(prompt_sizes)
            if prompt_sizes is not None
            else [len([t for t in p if t != self.tokenizer.pad_token_id]) for p in prompts]
        )
        str_samples, str_prompts, str_outputs = [], [], []
        for sample, size in zip(samples, sizes, strict=True):
            ids = [int(t) for t in sample]
            prompt = str(self.tokenizer.decode(ids[:size], skip_special_tokens=True))
            output = str(self.tokenizer.decode(ids[size:], skip_special_tokens=True))
            cut = min((output.find(s) for s in self.stop_sequences if s in output), default=-1)
            output = output[:cut] if cut >= 0 else output
            str_prompts.append(prompt)
            str_outputs.append(output)
            str_samples.append(prompt + output)
        return str_samples, str_prompts, str_outputs

    def evaluate(self, show: bool = True) -> dict[str, float]:
        """Greedy samples on the evaluation prompts; mean reward (and metric_fn) logged.

        With ``show``, a table of the first samples is printed.
        """
        env = self.env
        rows: list[tuple[str, str, float]] = []
        stats: dict[str, list[float]] = {}
        with env.eval_mode():
            prompts = env.reset()
            seen = 0
            while seen < env.num_test_prompts:
                completion_ids = self.agent.get_action(prompts, training=False).completion_ids
                sizes = [p["input_ids"].shape[1] for p in prompts]
                samples = [c[0] for c in completion_ids]
                str_samples, str_prompts, outputs = self.decode(
                    [p["input_ids"][0] for p in prompts], samples, sizes
                )
                scored = prompts
                prompts, rewards = env.step(completion_ids)
                take = min(len(scored), env.num_test_prompts - seen)
                for i in range(take):
                    rows.append((str_prompts[i], outputs[i], float(rewards[i, 0])))
                if self.metric_fn is not None:
                    answers = [p["answer"] for p in scored]
                    metric = self.metric_fn(
                        samples=str_samples[:take],
                        prompts=str_prompts[:take],
                        outputs=outputs[:take],
                        answers=answers[:take],
                    )
                    for k, v in metric.items():
                        stats.setdefault(f"metrics/{k}", []).extend(float(x) for x in v)
                seen += take
        out = {"reward/mean": sum(r for *_, r in rows) / max(1, len(rows))}
        out.update({k: sum(v) / len(v) for k, v in stats.items() if v})
        if show:
            print(f"{'prompt':<30} | {'output':<20} | reward")
            for prompt, output, reward in rows[:8]:
                print(f"{prompt[-30:]!r:<30} | {output[:20]!r:<20} | {reward:.2f}")
            print(", ".join(f"{k}={v:.3f}" for k, v in out.items()))
        return out

    def save_pretrained(
        self, directory: str | Path | None = None, merge: bool = False, **kwargs: Any
    ) -> Path:
        """Write a Hugging Face directory, with the tokenizer beside the model.

        It holds the LoRA adapter (peft format), or the whole model with merged weights (with
        ``merge`` or full fine-tuning).
        """
        out = Path(directory or Path(self.config.train.run_dir) / "hf_model")
        out.mkdir(parents=True, exist_ok=True)
        policy = self.agent.policy
        if policy.peft is None:
            policy.causal_lm.save_pretrained(str(out), **kwargs)
        elif merge:
            with policy.use_role("actor"):
                merged = copy.deepcopy(policy.peft)
            merged.set_adapter("actor")
            for name in list(merged.peft_config):
                if name != "actor":
                    merged.delete_adapter(name)
            merged.merge_and_unload().save_pretrained(str(out), **kwargs)
        else:
            policy.peft.save_pretrained(str(out), selected_adapters=["actor"], **kwargs)
        self.tokenizer.save_pretrained(str(out))
        return out


def make_trainer(config: RunConfig, **kwargs: Any) -> BaseRLTrainer:
    """The trainer of ``config.algo``: ``get_trainer(config.algo)(config, **kwargs)``.

    Args:
        config: The run configuration.
        **kwargs: The trainer's arguments (``reward_fn``, ``metric_fn``, ``stop_sequences``...).

    Returns:
        The built trainer.

    Raises:
        ConfigError: No trainer is registered under ``config.algo``.
    """
    if config.algo not in available_trainers():
        raise ConfigError(
            f"no trainer for algo {config.algo!r}; known: {', '.join(available_trainers())}"
        )
    return get_trainer(config.algo)(config, **kwargs)
