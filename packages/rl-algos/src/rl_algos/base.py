"""The LLM agent: a config plus parts (policy, engine, scorer, learner) and ``learn()``'s phases.

An agent is :class:`~rl_algos.config.AgentConfig` (typed hyperparameters; ``agent.<field>``
reads and writes it) plus composed parts:

* ``policy``: :class:`rl_adapters.PolicyModel` (LoRA actor, frozen reference, optional critic);
* ``engine``: an :class:`rl_rollout.Engine` for :meth:`LLMAlgorithm.get_action`;
* ``scorer``: :class:`~rl_algos.scoring.Scorer`, every log-prob (old, reference, current);
* ``learner``: :class:`~rl_algos.learner.Learner`, the guarded, accumulated optimizer step;
* per algorithm, :meth:`LLMAlgorithm.parts` returns data: the advantage estimator and the
  policy objective (:class:`AgentParts`), resolved by name through the rl-advantages and
  rl-losses registries.

``learn()`` reads as numbered phases, each a call into those parts; see docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from rl_adapters import PolicyModel
from rl_rollout import HFEngine, SamplingParams

from rl_algos import lifecycle, refusals
from rl_algos.batch import Batch, Estimates, MicroBatch, Normalizers, Scores, parse_experiences
from rl_algos.config import (
    AgentConfig,
    CosineLRScheduleConfig,
    HyperparameterConfig,
    VLLMConfig,
    config_fields,
)
from rl_algos.correction import SamplerCorrection
from rl_algos.distributed import ensure_deepspeed, zero_stage
from rl_algos.generation import (
    ActionResult,
    IdsTokenizer,
    generate_actions,
    greedy_fitness,
    model_eos_ids,
    prompt_ids,
    push_weights,
    sampling_params,
    vllm_engine,
)
from rl_algos.learner import Learner, StepResult, broadcast_module, summarize
from rl_algos.microbatch import RowSplit, split_rows
from rl_algos.objectives import LossTerms, PolicyObjective, fused_objective_loss, policy_loss
from rl_algos.packing import PackingReport
from rl_algos.router_balance import RouterBalance, build_router_balance
from rl_algos.router_replay import RouterReplay, build_router_replay, replaying
from rl_algos.scoring import Scorer, score_batch

__all__ = ["AgentParts", "Batch", "LLMAlgorithm"]


@dataclass(frozen=True)
class AgentParts:
    """What makes a policy-gradient agent its algorithm, as data (built per ``learn()``)."""

    estimate: Callable[[Batch, Scores], Estimates]
    """The advantage phase: ``(batch, scores) -> Estimates``."""
    objective: PolicyObjective
    """The policy loss (registered name and arguments) and the KL term."""
    extra_loss: Callable[[MicroBatch, Normalizers], LossTerms] | None = None
    """A further loss term per micro-batch (PPO's value loss), or None."""
    needs_old_logprobs: bool = True
    """Whether ``estimate`` reads ``Scores.old_logprobs`` (e.g. a KL in the reward). False
    lets an on-policy ``learn()`` skip the old-log-prob forward (:meth:`LLMAlgorithm.learn`)."""
    needs_sum_pi_squared: bool = False
    """Whether ``estimate`` reads ``Scores.sum_pi_squared`` (the optimal token baseline): the
    scoring phase then computes it in the actor's forward."""


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class LLMAlgorithm:
    """Shared machinery of the LLM agents (AgileRL's constructor arguments).

    The hyperparameters are :attr:`config_class` fields (``agent.lr`` reads and writes
    ``agent.config.lr``); the model is wrapped by :class:`rl_adapters.PolicyModel`, generation
    goes through an :class:`rl_rollout.Engine`, log-probs through :class:`~rl_algos.Scorer`
    (the fused head, action positions only), the optimizer step through
    :class:`~rl_algos.Learner`, and all math through rl-advantages and rl-losses.

    Dropout is off: the model stays in ``eval()`` mode so that the log-probs used for the
    ratio, the reference and the gradient are those of one deterministic policy.
    """

    algo_name: ClassVar[str] = "llm"
    uses_critic: ClassVar[bool] = False
    config_class: ClassVar[type[AgentConfig]] = AgentConfig
    _init_kwargs: dict[str, Any]
    config: AgentConfig
    lean_report = property(lambda self: self.policy.lean_report, doc="The policy's LeanReport.")

    def __new__(cls, *args: Any, **kwargs: Any) -> LLMAlgorithm:  # noqa: D102
        obj = super().__new__(cls)
        # the JSON-representable constructor arguments, saved with checkpoints for `load`
        object.__setattr__(obj, "_init_kwargs", {k: v for k, v in kwargs.items() if _jsonable(v)})
        return obj

    # -- config fields as attributes -------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """``agent.<field>`` of the config (called only when normal lookup fails)."""
        if name.startswith("__") or name == "config" or "config" not in self.__dict__:
            raise AttributeError(name)
        config = self.__dict__["config"]
        if name in config_fields(type(config)):
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Writes to a config field go to the config (so mutations reach ``learn()``)."""
        config = self.__dict__.get("config")
        if config is not None and name in config_fields(type(config)):
            setattr(config, name, value)
        else:
            object.__setattr__(self, name, value)

    # -- construction ----------------------------------------------------------------------------

    def __init__(
        self,
        pad_token_id: int,
        pad_token: str,
        model_name: str | None = None,
        actor_network: Any = None,
        model_config: dict[str, Any] | None = None,
        hp_config: HyperparameterConfig | None = None,
        index: int = 0,
        lora_config: Any = None,
        cosine_lr_schedule_config: CosineLRScheduleConfig | None = None,
        accelerator: Any = None,
        device: str | torch.device = "cpu",
        vllm_config: VLLMConfig | None = None,
        logit_mask: torch.Tensor | None = None,
        tokenizer: Any = None,
        **hyperparameters: Any,
    ) -> None:
        known = config_fields(self.config_class)
        refusals.refuse_unknown(type(self).__name__, hyperparameters, known)
        if actor_network is None and model_name is None:
            raise ValueError("pass `actor_network` (a transformers model) or `model_name`")
        refusals.refuse_agilerl_only(hyperparameters)
        self.config = self.config_class(**{k: v for k, v in hyperparameters.items() if k in known})
        cfg = self.config
        refusals.refuse_unused(cfg, lora_config, vllm_config, tokenizer)
        refusals.refuse_unbuildable(cfg, model_name, critic_adapter=self._critic_adapter)
        self.index = index
        self.pad_token_id = int(pad_token_id)
        self.pad_token = pad_token
        self.model_name = model_name
        lifecycle.check_hp_config(type(self).__name__, hp_config, cfg)
        self.hp_config = hp_config
        self.cosine_lr_schedule_config = cosine_lr_schedule_config
        self.accelerator = accelerator
        self.vllm_config = vllm_config
        self.logit_mask = logit_mask
        self.device = torch.device(accelerator.device if accelerator is not None else device)
        self.policy = self._build_policy(model_name, actor_network, model_config, lora_config)
        self.router_balance, self.router_replayer = self._build_routers()
        refusals.refuse_with_deepspeed(cfg, self.policy.causal_lm, zero_stage(accelerator))
        self.extra_modules: dict[str, torch.nn.Module] = {}
        eos_ids = model_eos_ids(self.policy.causal_lm)
        self.eos_token_id = eos_ids[0] if eos_ids else self.pad_token_id
        self.stop_token_ids = eos_ids[1:]
        self.tokenizer = tokenizer or IdsTokenizer(self.pad_token_id, self.eos_token_id)
        self.engine = self.make_engine(self.policy)
        self._vllm_lora_dir: str | None = None
        if cfg.use_vllm:  # pragma: no cover - needs vLLM and CUDA
            self.engine = vllm_engine(str(model_name), vllm_config, cfg.max_model_len)
        self._rng = random.Random(cfg.seed)
        self._torch_rng = torch.Generator().manual_seed(cfg.seed)
        self.steps = 0
        self.reference_updates = 0
        self.fitness: list[float] = []
        self.scores: list[float] = []
        self.mutation_history: list[dict[str, Any]] = []
        self.packing_report = PackingReport()  # what use_sequence_packing=None chose
        broadcast_module(self.policy)
        self.learner = self.build_learner()

    def _build_policy(
        self, model_name: str | None, actor_network: Any, model_config: Any, lora_config: Any
    ) -> PolicyModel:
        cfg = self.config
        reference: Any = (
            ("copy" if cfg.beta > 0 else None)
            if cfg.full_finetune
            else ("adapter" if cfg.use_separate_reference_adapter else "base")
        )
        options: dict[str, Any] = {
            "lora_config": lora_config,
            "reference": reference,
            "critic": self._critic_adapter,
            "gradient_checkpointing": cfg.gradient_checkpointing,
            "activation_offload": cfg.activation_offload,
            "lora_target_scope": cfg.lora_target_scope or "language",
            "seed": cfg.seed,
            "full_finetune": cfg.full_finetune,
            "lean_forwards": cfg.lean_forwards,
        }
        if actor_network is None:
            name = str(model_name)
            policy = PolicyModel.from_pretrained(name, model_config=model_config, **options)
        else:
            policy = PolicyModel(actor_network, **options)
        policy.to(self.device)
        policy.eval()
        return policy

    def _build_routers(self) -> tuple[RouterBalance | None, RouterReplay | None]:
        """A mixture-of-experts policy's load-balancing loss and routing replay (or None)."""
        cfg, agent, model = self.config, type(self).__name__, self.policy.causal_lm
        return (
            build_router_balance(agent, cfg.router_aux_loss_coef, model),
            build_router_replay(agent, cfg.router_replay, model),
        )

    def make_engine(self, policy: PolicyModel) -> HFEngine:
        """The Hugging Face generation engine over ``policy``'s model."""
        return HFEngine(
            policy.causal_lm,
            self.tokenizer,
            max_model_len=self.config.max_model_len,
            prompts_per_batch=self.config.hf_generate_chunk_size,
            record_routes=self.config.router_replay == "R3",
        )

    @property
    def _critic_adapter(self) -> bool:
        """Whether the critic (``uses_critic``) is a LoRA adapter + value head (rl-adapters)."""
        return self.uses_critic and getattr(self.config, "critic_mode", "adapter") == "adapter"

    def actor_parameters(self) -> list[torch.nn.Parameter]:
        """The trainable actor parameters (LoRA weights, or the whole model)."""
        return self.policy.trainable_parameters("actor")

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW parameter groups: the actor's first (``lr``), then the agent's other parts."""
        return [{"params": self.actor_parameters(), "lr": self.config.lr}]

    def build_learner(self) -> Learner:
        """A fresh :class:`~rl_algos.Learner` over :meth:`param_groups`."""
        cfg = self.config
        return Learner(
            self.param_groups(),
            lr=cfg.lr,
            max_grad_norm=cfg.max_grad_norm,
            schedule=self.cosine_lr_schedule_config,
            accelerator=self.accelerator,
            skip_nonfinite=cfg.skip_nonfinite,
            micro_batch_size=cfg.micro_batch_size_per_gpu or cfg.batch_size,
            device=self.device,
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The learner's AdamW."""
        return self.learner.optimizer

    @property
    def lr_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR | None:
        """The learner's schedule, or None."""
        return self.learner.lr_scheduler

    @property
    def scorer(self) -> Scorer:
        """How this agent scores tokens now (its policy, temperature and ZeRO stage)."""
        cfg, split = self.config, RowSplit(micro_batch_tokens=self.config.micro_batch_tokens)
        packing, chunk = cfg.use_sequence_packing, cfg.fused_logprobs_chunk_rows
        zero, report = self.learner.zero_stage, self.packing_report
        share = cfg.share_prompt_prefix
        return Scorer(
            self.policy, cfg.temperature, chunk, zero, packing, split, report,
            router=self.router_balance, share_prefix=share, replay=self.router_replayer,
        )  # fmt: skip

    # -- generation ------------------------------------------------------------------------------

    def _group_size(self, training: bool) -> int:
        return int(getattr(self.config, "group_size", 1)) if training else 1

    def sampling_params(self, training: bool = True) -> SamplingParams:
        """The sampling settings of ``get_action`` (training) or evaluation (greedy)."""
        return sampling_params(
            self.config,
            training,
            group_size=self._group_size(True),
            seed=self._rng.randrange(2**31) if training else 0,
            stop_token_ids=self.stop_token_ids,
            has_tokenizer=not isinstance(self.tokenizer, IdsTokenizer),
            logit_mask=self.logit_mask,
        )

    def get_action(
        self,
        obs: Sequence[dict[str, Any]] | dict[str, Any],
        training: bool = True,
        repeat_prompts: bool = True,
        **kwargs: Any,
    ) -> ActionResult:
        """Generate completions for prompt dicts (``input_ids`` [1, P], ``attention_mask``).

        With ``training``, ``group_size`` samples per prompt (GRPO; one with
        ``repeat_prompts=False``) with the training sampling settings; otherwise one greedy
        completion. Returns the flat ``[N, L]`` :class:`~rl_algos.batch.Rollout`, which also
        unpacks as AgileRL's per-prompt blocks (see :class:`~rl_algos.ActionResult`).
        """
        ids = prompt_ids(obs)
        ensure_deepspeed(self)
        merge = self.config.merge_lora_for_generation and not self.config.use_vllm
        with self.policy.merged_for_generation(merge):
            params = self.sampling_params(training)
            return generate_actions(self.engine, ids, params, repeat_prompts, self.pad_token_id)

    # -- learn -----------------------------------------------------------------------------------

    def parts(self, batch: Batch) -> AgentParts:
        """This algorithm's estimator and objective for ``batch`` (checked against it)."""
        raise NotImplementedError(f"{type(self).__name__} defines no policy-gradient parts")

    def parse(self, experiences: Any, turn_ids: Any = None, sampling_logps: Any = None) -> Batch:
        """:func:`~rl_algos.batch.parse_experiences` with this agent's pad id and device."""
        return parse_experiences(
            experiences,
            pad_token_id=self.pad_token_id,
            device=self.device,
            turn_ids=turn_ids,
            sampling_logps=sampling_logps,
        )

    def learn(
        self,
        experiences: Any,
        turn_ids: torch.Tensor | None = None,
        sampling_logps: Any = None,
    ) -> dict[str, float]:
        """One update from ``(completion_ids, action_masks, rewards)``; returns metrics.

        Phases: 1. parse the input into a typed :class:`Batch`; 2. resolve the algorithm's
        parts; 3. score old (and reference) log-probs; 4. estimate advantages; 5. correct for
        a sampler/trainer mismatch (when ``sampling_logps`` are given); 6. update:
        ``update_epochs`` passes in shuffled minibatches of ``batch_size`` rows, each one
        learner step accumulated over micro-batches (``micro_batch_size_per_gpu`` rows,
        ``micro_batch_tokens`` tokens) with global normalisers (the summed micro-batch
        losses equal the minibatch loss).
        Phase 3 takes the old log-probs from the sampler with ``clip_against_sampler``, and
        skips them when the update is :meth:`on_policy` (one epoch of one minibatch) and the
        parts do not read them: they are the loss's own, detached
        (ratio 1, as TRL's GRPO with ``num_iterations == 1``), and a mismatch correction
        weighs each micro-batch by its own log-probs (the fused loss needs them scored).

        With a row filter (``filter_zero_adv``, DAPO's dynamic sampling) the metrics include
        ``kept_groups``, the groups of this process's batch with a row left in the loss. A
        minibatch with no row left on any process takes no optimizer step (nor a scheduler
        step; :attr:`steps` counts the steps taken, so it does not advance) and reports
        nothing: when every group is filtered out the call returns ``kept_groups`` 0 and
        ``mean_reward``, without ``loss``, ``grad_norm`` or loss diagnostics.

        Raises:
            ValueError: malformed experiences (shapes, NaN rewards, options the batch lacks).
            FloatingPointError: a non-finite loss (weights untouched), unless
                ``skip_nonfinite`` (then the step is skipped with a warning).
        """
        batch = self.parse(experiences, turn_ids, sampling_logps)  # 1. parse
        parts = self.parts(batch)  # 2. parts
        scores = score_batch(  # 3. score
            self.scorer,
            batch,
            with_reference=self.config.beta > 0,
            with_old=parts.needs_old_logprobs or not self.on_policy(batch),
            old_from_sampler=self.config.clip_against_sampler,
            with_sum_pi_squared=parts.needs_sum_pi_squared,
        )
        with torch.no_grad():
            estimates = parts.estimate(batch, scores)  # 4. advantages
        estimates = self.correction.weigh_batch(batch, scores, estimates)  # 5. correction
        metrics = self._update(batch, scores, estimates, parts)  # 6. update
        out = summarize(metrics, batch.rewards)
        if estimates.keep is not None:
            groups = estimates.keep.view(-1, self._group_size(True)).any(dim=1)
            out["kept_groups"] = float(groups.sum())
        if self.config.use_vllm and metrics.get("loss"):
            self._push_weights_to_engine()
        return out

    @property
    def correction(self) -> SamplerCorrection:
        """Phase 5 as the config asks for it now (:mod:`rl_algos.correction`)."""
        return SamplerCorrection.from_config(self.config)

    def on_policy(self, batch: Batch) -> bool:
        """Whether ``learn(batch)`` is one optimizer step (see :meth:`learn`, phase 3)."""
        cfg = self.config
        one_step = cfg.update_epochs == 1 and cfg.batch_size >= batch.num_rows
        return one_step and not (self.correction.applies(batch) and cfg.use_liger_loss)

    def minibatches(self, num_rows: int) -> list[torch.Tensor]:
        """``update_epochs`` shuffled passes of ``batch_size`` sorted row indices each.

        Also hands the learner the current clipping and guard settings (HPO may mutate them).
        """
        self.learner.max_grad_norm = self.config.max_grad_norm
        self.learner.skip_nonfinite = self.config.skip_nonfinite
        out = []
        for _ in range(self.config.update_epochs):
            order = torch.randperm(num_rows, generator=self._torch_rng)
            for start in range(0, num_rows, self.config.batch_size):
                out.append(order[start : start + self.config.batch_size].sort().values)
        return [rows.to(self.device) for rows in out]

    def micro_batches(
        self, batch: Batch, scores: Scores | None, estimates: Estimates, rows: torch.Tensor
    ) -> list[MicroBatch]:
        """``rows`` in micro-batches (:func:`rl_algos.microbatch.split_rows`)."""
        split = RowSplit(self.config.micro_batch_size_per_gpu, self.config.micro_batch_tokens)
        together = None
        if split.micro_batch_tokens is not None:  # keeps the rows that share a prompt together
            ids, attn, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.mask[rows]
            together = self.scorer.together(ids, attn, mask)
        groups = split_rows(rows, batch.attention_mask, split, together)
        return [MicroBatch.select(batch, scores, estimates, g) for g in groups]

    def _update(
        self, batch: Batch, scores: Scores, estimates: Estimates, parts: AgentParts
    ) -> dict[str, list[float]]:
        ensure_deepspeed(self)
        if self.policy.training:  # dropout stays off (the class docstring); once per update
            self.policy.eval()
        fused = self.config.use_liger_loss and parts.objective.fusable
        metrics: dict[str, list[float]] = {}
        for rows in self.minibatches(batch.num_rows):
            mbs = self.micro_batches(batch, scores, estimates, rows)
            turn_mask = None if estimates.turn_mask is None else estimates.turn_mask[rows]
            norm = self.learner.normalizers(torch.cat([mb.mask for mb in mbs]), turn_mask)
            turn_ids = estimates.turn_ids if estimates.turn_ids is not None else batch.turn_ids
            objective = parts.objective.for_minibatch(None if turn_ids is None else turn_ids[rows])
            minibatch_parts = dataclasses.replace(parts, objective=objective)
            loss_fn = functools.partial(
                self._micro_loss, norm=norm, parts=minibatch_parts, fused=fused
            )
            with self.policy.lean_lora():  # one autograd node per LoRA layer (rl_adapters)
                self._apply(self.learner.step(mbs, loss_fn, norm, self._where()), metrics)
        return metrics

    def _micro_loss(
        self, mb: MicroBatch, norm: Normalizers, parts: AgentParts, fused: bool
    ) -> LossTerms | None:
        """One micro-batch's loss: the objective (plain or fused) plus the extra term."""
        router, replay = self.router_balance, self.router_replayer
        with (
            router.training() if router is not None else contextlib.nullcontext(),
            replaying(replay, mb.routes),  # R2: the old forward's routes
        ):
            if fused:
                terms = fused_objective_loss(parts.objective, self.scorer, mb, norm)
            else:
                lp = self.scorer.logprobs(mb.input_ids, mb.attention_mask, mb.mask)
                if not bool(torch.isfinite(lp).all()):  # 0 off the mask; else the loss raises
                    return None
                mb = self.correction.weigh_micro_batch(mb, lp)  # 5., on-policy
                terms = policy_loss(parts.objective, mb, lp, norm)
        if router is not None:  # the config's weight (HPO may mutate it); None: the model's
            coef = self.config.router_aux_loss_coef
            coef = router.coef if coef is None else coef
            aux, mean = router.term(mb.attention_mask, mb.mask, norm.sequences, coef, mb.routes)
            terms = LossTerms(
                terms.loss + aux.to(terms.loss.dtype), {**terms.metrics, "aux_loss": mean}
            )
        if replay is not None and (flips := replay.flips()) is not None:
            terms = LossTerms(terms.loss, {**terms.metrics, "route_flips": flips})
        if parts.extra_loss is None:
            return terms
        extra = parts.extra_loss(mb, norm)
        return LossTerms(terms.loss + extra.loss, {**terms.metrics, **extra.metrics})

    def _where(self) -> str:
        return f"optimizer step {self.steps} of {type(self).__name__}"

    def _apply(self, result: StepResult, metrics: dict[str, list[float]]) -> None:
        """Count an applied step and collect its metrics (or the skip)."""
        if result.empty:  # nothing to learn from: no step taken, nothing to report
            return
        if not result.applied:
            metrics.setdefault("skipped_steps", []).append(1.0)
            return
        self.steps += 1
        metrics.setdefault("loss", []).append(result.loss)
        metrics.setdefault("grad_norm", []).append(result.grad_norm)
        for k, value in result.metrics.items():
            metrics.setdefault(k, []).append(value)

    def _push_weights_to_engine(self) -> None:  # pragma: no cover - needs vLLM and CUDA
        """After an update, give the generation engine (vLLM) the trained actor."""
        self._vllm_lora_dir = push_weights(self.engine, self.policy, self._vllm_lora_dir)

    # -- evaluation and the reference ------------------------------------------------------------

    def test(self, env: Any, loop: int = 1) -> torch.Tensor:
        """Mean reward of greedy completions on ``env``'s test split over ``loop`` batches.

        Works with ``rl_envs.ReasoningGym`` (inside its ``eval_mode``); the score is
        appended to :attr:`fitness`.
        """
        fitness = greedy_fitness(self, env, loop)
        self.fitness.append(float(fitness))
        return fitness

    def set_reference_policy(self, reference_update_tracker: int) -> None:
        """Copy the actor onto the reference when the tracker moved (e.g. a new dataset pass)."""
        if reference_update_tracker > self.reference_updates:
            if self.policy.reference_mode in ("adapter", "copy"):
                self.policy.sync_reference()
            self.reference_updates = reference_update_tracker

    # -- checkpoints, clones, HPO (rl_algos.lifecycle) -------------------------------------------

    def saved_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters a checkpoint holds: adapters and heads (LoRA) or all (full)."""
        return [
            p
            for n, p in self.policy.named_parameters()
            if self.policy.peft is None or "lora_" in n or "value_head" in n
        ]

    def save_checkpoint(
        self, path: str | Path, lora_only: bool = True, save_optimizer: bool = True
    ) -> Path:
        """Save adapters (safetensors), optimizer/scheduler and agent state (JSON) atomically.

        Distributed, every process must call it (ZeRO-3 gathers the weights) and process 0
        writes. Under DeepSpeed the optimizer state is not saved (a warning says so).
        """
        del lora_only  # adapters are always what is saved in LoRA mode
        return lifecycle.save_agent(self, path, save_optimizer, self.extra_modules)

    def load_checkpoint(self, path: str | Path, load_optimizer: bool = True) -> None:
        """Restore what :meth:`save_checkpoint` wrote (loading never executes code)."""
        lifecycle.load_agent(self, path, load_optimizer, self.extra_modules)

    @classmethod
    def load(
        cls,
        path: str | Path,
        actor_network: Any = None,
        device: str | torch.device = "cpu",
        accelerator: Any = None,
        **overrides: Any,
    ) -> LLMAlgorithm:
        """Rebuild an agent from a checkpoint: its class and constructor arguments, then weights.

        The checkpoint holds the adapters (or the full weights) but not the base model: pass
        ``actor_network`` (a fresh base) unless the agent was built from ``model_name``.
        Arguments that are not JSON (``lora_config``, ``tokenizer``, ``hp_config``) come back
        through ``overrides``.
        """
        classes = lifecycle.subclasses(LLMAlgorithm)  # the checkpoint names its class
        agent: LLMAlgorithm = lifecycle.load_new_agent(
            cls, classes, path, actor_network, device, accelerator, overrides
        )
        return agent

    def clone(self, index: int | None = None) -> LLMAlgorithm:
        """An independent copy: its own adapters, optimizer state and RNGs.

        In LoRA mode the frozen base weights are shared with this agent (not copied); with
        ``full_finetune`` the whole model is copied.
        """
        twin: LLMAlgorithm = lifecycle.clone_agent(self, index)
        return twin

    @classmethod
    def population(cls, size: int, **kwargs: Any) -> list[LLMAlgorithm]:
        """``size`` agents (indices 0..size-1) built like ``cls(**kwargs)``, seeds offset."""
        if size < 1:
            raise ValueError(f"`size` must be >= 1, got {size}")
        first = cls(**kwargs)
        return [first] + [first.clone(index=i) for i in range(1, size)]

    def mutate_hyperparameter(self, rng: random.Random | None = None) -> dict[str, Any]:
        """Mutate one hyperparameter from ``hp_config`` and log it in :attr:`mutation_history`."""
        return lifecycle.mutate_hyperparameter(self, rng)
