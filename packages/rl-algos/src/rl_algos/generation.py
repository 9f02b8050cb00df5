"""Generation for the agents: sampling settings and ``get_action`` over an rl-rollout engine."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rl_rollout import SamplingParams

from rl_algos.batch import ActionResult, Rollout
from rl_algos.config import AgentConfig, VLLMConfig

__all__ = [
    "ActionResult",
    "IdsTokenizer",
    "generate_actions",
    "greedy_fitness",
    "model_eos_ids",
    "prompt_ids",
    "push_weights",
    "remote_engine",
    "rollout_of",
    "sampling_params",
    "vllm_engine",
]


class IdsTokenizer:
    """Enough of a tokenizer for :class:`rl_rollout.HFEngine` when the agent only sees ids."""

    chat_template = None

    def __init__(self, pad_token_id: int, eos_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids as space-separated numbers (special ids dropped)."""
        keep = [
            i
            for i in ids
            if not skip_special_tokens or i not in (self.pad_token_id, self.eos_token_id)
        ]
        return " ".join(str(i) for i in keep)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        """Refuses: there is no vocabulary."""
        raise ValueError("this agent has no tokenizer: pass prompts as token ids")


def greedy_fitness(agent: Any, env: Any, loop: int) -> torch.Tensor:
    """Mean reward of ``agent``'s greedy completions over ``loop`` test batches of ``env``.

    Runs inside the environment's ``eval_mode`` (e.g. :class:`rl_envs.ReasoningGym`).
    """
    rewards: list[torch.Tensor] = []
    with env.eval_mode():
        prompts = env.reset()
        for _ in range(loop):
            completion_ids, _ = agent.get_action(prompts, training=False)
            prompts, r = env.step(completion_ids)
            rewards.append(r.float().mean())
    return torch.stack(rewards).mean()


def model_eos_ids(model: Any) -> tuple[int, ...]:
    """The model's EOS ids: its generation config's, else its config's.

    The first is *the* EOS; the others end a completion like it (stop ids).
    """
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = eos if eos is not None else getattr(model.config, "eos_token_id", None)
    return tuple(int(e) for e in ([eos] if isinstance(eos, int) else list(eos or [])))


def sampling_params(
    config: AgentConfig,
    training: bool,
    *,
    group_size: int,
    seed: int,
    stop_token_ids: tuple[int, ...],
    has_tokenizer: bool,
    logit_mask: torch.Tensor | None,
) -> SamplingParams:
    """The sampling settings of ``get_action`` (training) or evaluation (greedy)."""
    max_new = config.max_output_tokens or max(1, (config.max_model_len or 1024) // 2)
    if config.stop_sequences and not has_tokenizer:
        raise ValueError("`stop_sequences` need a real tokenizer: pass `tokenizer=`")
    if not training:
        return SamplingParams.eval_preset(
            max_new_tokens=max_new,
            min_new_tokens=min(config.min_output_tokens, max_new),
            stop_token_ids=stop_token_ids,
            stop=config.stop_sequences,
            logit_mask=logit_mask,
        )
    return SamplingParams(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k or 0,
        min_p=config.min_p,
        repetition_penalty=config.repetition_penalty,
        max_new_tokens=max_new,
        min_new_tokens=min(config.min_output_tokens, max_new),
        stop_token_ids=stop_token_ids,
        n=group_size,
        seed=seed,
        return_logprobs=True,
        stop=config.stop_sequences,
        logit_mask=logit_mask,
    )


def prompt_ids(obs: Sequence[dict[str, Any]] | dict[str, Any]) -> list[list[int]]:
    """Each prompt dict's ids (``input_ids`` [1, P], unpadded by ``attention_mask``), checked."""
    prompts = [obs] if isinstance(obs, dict) else list(obs)
    if not prompts:
        raise ValueError("`obs` is empty: pass at least one prompt dict")
    ids: list[list[int]] = []
    for i, p in enumerate(prompts):
        if "input_ids" not in p:
            raise ValueError(f"prompt {i} has no 'input_ids' (keys: {sorted(p)})")
        row = torch.as_tensor(p["input_ids"]).reshape(-1)
        am = p.get("attention_mask")
        if am is not None:
            row = row[torch.as_tensor(am).reshape(-1).bool()]
        ids.append(row.tolist())
    return ids


def generate_actions(
    engine: Any,
    ids: list[list[int]],
    params: SamplingParams,
    repeat_prompts: bool,
    pad_token_id: int,
) -> ActionResult:
    """Completions of ``ids`` by ``engine``, as one flat :class:`~rl_algos.batch.Rollout`.

    With ``repeat_prompts=False`` every row is its own trajectory (one sample each).
    """
    if not repeat_prompts:
        params = dataclasses.replace(params, n=1)
    with torch.no_grad():
        result = engine.generate(ids, params)
    rollout = rollout_of(ids, result, params.n, pad_token_id)
    return ActionResult(
        rollout, extra={"finish_reasons": result.finish_reasons, "texts": result.texts}
    )


def rollout_of(
    prompts: list[list[int]], result: Any, group_size: int, pad_token_id: int
) -> Rollout:
    """The [N, L] rollout of an engine's result: each row's prompt, then its completion.

    Args:
        prompts: B prompts' ids.
        result: The engine's :class:`rl_rollout.RolloutResult`: ``completion_ids`` and
            ``completion_mask`` [N, C], ``logprobs`` [N, C] or None, prompt-major.
        group_size: G samples per prompt.
        pad_token_id: The right-padding id.
    """
    comp = result.completion_ids
    N, C = comp.shape
    lengths = torch.tensor([len(p) for p in prompts], device=comp.device)
    P = int(lengths.max())
    padded = torch.full((len(prompts), P), pad_token_id, dtype=comp.dtype, device=comp.device)
    for b, prompt in enumerate(prompts):
        padded[b, : len(prompt)] = torch.tensor(prompt, dtype=comp.dtype)
    input_ids = torch.full((N, P + C), pad_token_id, dtype=comp.dtype, device=comp.device)
    input_ids[:, :P] = padded.repeat_interleave(group_size, 0)
    lengths = lengths.repeat_interleave(group_size)
    cols = lengths[:, None] + torch.arange(C, device=comp.device)  # [N, C] completion columns
    input_ids.scatter_(1, cols, comp)
    mask = torch.zeros(N, P + C - 1, dtype=torch.bool, device=comp.device)
    mask.scatter_(1, cols - 1, result.completion_mask.bool())  # shifted by one
    logps = None
    if result.logprobs is not None:
        logps = torch.zeros(N, P + C - 1, device=comp.device)
        logps.scatter_(1, cols - 1, result.logprobs.to(torch.float32))
    routes = getattr(result, "routes", None)
    if routes is not None:  # [N, P' + C, Y, k], prompts left-padded to P': re-laid like the ids
        width = routes.shape[1] - C
        t = torch.arange(P + C, device=comp.device)[None]
        n = lengths[:, None]
        source = torch.where(t < n, width - n + t, width + t - n)  # [N, P + C]
        ran = source < routes.shape[1]
        index = source.clamp(max=routes.shape[1] - 1)[:, :, None, None]
        routes = routes.to(comp.device).gather(1, index.expand(-1, -1, *routes.shape[2:]))
        routes = routes.masked_fill(~ran[:, :, None, None], -1)
    return Rollout(input_ids, mask, lengths, group_size, logps, sampling_routes=routes)


def vllm_engine(
    model_name: str, config: VLLMConfig | None, max_model_len: int | None
) -> Any:  # pragma: no cover - needs vLLM and CUDA
    """A colocated :class:`rl_rollout.VLLMEngine` for ``model_name`` (LoRA enabled)."""
    from rl_rollout import VLLMEngine  # the optional vLLM extra: imported only when used

    vc = config or VLLMConfig()
    return VLLMEngine(
        model_name,
        max_model_len=vc.max_model_len or max_model_len,
        gpu_memory_utilization=vc.gpu_memory_utilization,
        max_num_seqs=vc.max_num_seqs,
        tensor_parallel_size=vc.tensor_parallel_size,
        enable_sleep_mode=vc.sleep_mode,
        enable_lora=True,
    )


def remote_engine(url: str, timeout: float) -> Any:
    """A :class:`rl_rollout.RemoteEngine` to the rollout server at ``url``, health-checked.

    ``url`` is ``http://host:port``; a server that is down fails here, named, not mid-run.

    Args:
        url: The server's base URL.
        timeout: Seconds any call (generation, weight sync) may take.
    """
    from rl_rollout import RemoteEngine

    engine = RemoteEngine(url, timeout=timeout)
    engine.health()
    return engine


def push_weights(
    engine: Any, policy: Any, previous_dir: str | None
) -> str | None:  # pragma: no cover - needs vLLM and CUDA
    """After an update, give the generation engine (vLLM) the trained actor.

    LoRA: the actor adapter is saved (safetensors) to a fresh directory and loaded as a new
    adapter (vLLM reads it at the next ``generate``; the previous version's directory is removed
    then); returns that directory. Full fine-tuning: every weight is copied by name.
    """
    if policy.peft is None:
        engine.update_weights(policy.causal_lm.named_parameters())
        return previous_dir
    directory = tempfile.mkdtemp(prefix="rl-algos-vllm-lora-")
    policy.peft.save_pretrained(directory, selected_adapters=["actor"])
    engine.load_lora("actor", str(Path(directory) / "actor"))
    if previous_dir is not None:
        shutil.rmtree(previous_dir, ignore_errors=True)
    return directory
