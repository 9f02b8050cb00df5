"""One ``rl_algos.GRPO.learn()`` call against a plain PyTorch loop of the same math.

Batch: ``B = 8`` prompts x ``G = 8`` completions (``N = 64`` rows), prompts of 16 tokens,
completions of 8..48 tokens right-padded to 48 (``L = 64``), action masks on the completion
tokens, uniform random rewards; all drawn from one seeded ``torch.Generator``. Models: the
rl-testing tiny Qwen2 (~80k parameters, char vocabulary) and a random Qwen2 of ~19M parameters
(hidden 384, 6 layers, 6 heads, 2 KV heads, intermediate 1536, vocabulary 8192, untied head).

Both variants update a ``rl_adapters.PolicyModel`` (LoRA r=8, alpha 16, all linear layers, a
frozen reference adapter) built from identical weights, one step per call:

* ``plain``: no-grad full-logit forwards (``policy.logits``, ``log_softmax``, gather at the
  temperature) for the old and the reference log-probs, group-relative advantages
  ``(r - mean) / (std + 1e-6)``, the clipped surrogate (0.2) plus ``beta`` x k3 KL with
  ``seq_mean_token_mean`` aggregation, backward, ``clip_grad_norm_(1.0)``, AdamW (lr 1e-4).
* ``rl_algos.learn``: ``GRPO(loss_type="grpo", beta=0.04, update_epochs=1, batch_size=N,
  micro_batch_size_per_gpu=None, max_grad_norm=1.0, lr=1e-4, temperature=1.0).learn(...)``.

Both run once as warm-up and the same number of timed calls (21 on the tiny model, 5 on the
20M), so the two policies receive the
same updates: ``grad_rel_diff`` (in ``extra``) is the largest gradient difference of the last
call over the largest gradient, a check that the plain loop computes the same loss.

``peak_extra_MiB``: on CUDA, the peak allocated memory of the warm-up call above what was
allocated before it. On CPU (full runs only, as in ``bench_kernels``), the peak resident
memory of one call in a fresh process per (case, variant), minus the peak before the call; a
call on one small group goes first so that one-time costs are not counted. Resident memory
includes the allocator's slack, so it is coarse for the tiny model.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from harness import Row, measure, with_memory_ratios, with_ratios
from peft import LoraConfig
from rl_adapters import PolicyModel
from rl_algos import GRPO
from rl_testing.models import tiny_causal_lm, tiny_qwen2
from transformers import PreTrainedModel

B, G, PROMPT_LEN, COMPLETION_LEN = 8, 8, 16, 48
N, L = B * G, PROMPT_LEN + COMPLETION_LEN
PAD_ID = 0  # both models: <pad> = 0, <bos> = 1, <eos> = 2
BETA, CLIP, MAX_GRAD_NORM, LR, TEMPERATURE, STD_EPS = 0.04, 0.2, 1.0, 1e-4, 1.0, 1e-6
SEED = 0


def _model(name: str) -> PreTrainedModel:
    """A fresh model with weights depending only on ``SEED`` (each agent wraps its own)."""
    if name == "tiny":
        model, _ = tiny_causal_lm("qwen2", seed=SEED)
        return model
    return tiny_qwen2(
        8192, seed=SEED, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
        num_key_value_heads=2, intermediate_size=1536, tie_word_embeddings=False,
        pad_token_id=PAD_ID, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def _agent(name: str, device: torch.device) -> GRPO:
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    return GRPO(
        pad_token_id=PAD_ID, pad_token="<pad>", actor_network=_model(name), lora_config=lora,
        group_size=G, loss_type="grpo", beta=BETA, update_epochs=1, batch_size=N,
        micro_batch_size_per_gpu=None, max_grad_norm=MAX_GRAD_NORM, lr=LR,
        temperature=TEMPERATURE, device=device, seed=SEED,
    )  # fmt: skip


@dataclass
class Experience:
    ids: torch.Tensor  # [N, L] long, right-padded with PAD_ID
    attention_mask: torch.Tensor  # [N, L] long, 1 up to the last real token
    action_mask: torch.Tensor  # [N, L - 1] bool, True where token t + 1 is a completion token
    rewards: torch.Tensor  # [N] float


def _experience(
    vocab: int, device: torch.device, prompts: int = B, completion_len: int = COMPLETION_LEN
) -> Experience:
    """``prompts * G`` rows of ``PROMPT_LEN`` prompt tokens and 8..``completion_len`` actions."""
    gen = torch.Generator().manual_seed(SEED)
    n, length = prompts * G, PROMPT_LEN + completion_len
    ids = torch.randint(3, vocab, (n, length), generator=gen)  # no pad / bos / eos inside
    ids[:, 0] = 1
    lengths = torch.randint(8, completion_len + 1, (n,), generator=gen)
    lengths[::G] = completion_len  # the longest completion fills the width
    pos = torch.arange(length)
    real = pos[None] < (PROMPT_LEN + lengths)[:, None]
    ids = ids.masked_fill(~real, PAD_ID)
    action = real[:, 1:] & (pos[None, 1:] >= PROMPT_LEN)
    rewards = torch.rand(n, generator=gen)
    return Experience(ids.to(device), real.long().to(device), action.to(device), rewards.to(device))


def _plain_step(
    policy: PolicyModel, optimizer: torch.optim.Optimizer, exp: Experience
) -> torch.Tensor:
    """One GRPO update written out with full logits; returns the (detached) loss."""
    ids, attn, mask = exp.ids, exp.attention_mask, exp.action_mask
    targets = ids[:, 1:, None]

    def logprobs(role: str) -> torch.Tensor:
        logits = policy.logits(ids, attn, role=role)[:, :-1].float() / TEMPERATURE
        return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)

    policy.eval()
    with torch.no_grad():
        old = logprobs("actor")
        ref = logprobs("reference")
        r = exp.rewards.float().view(-1, G)
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + STD_EPS)
        adv = adv.reshape(-1, 1)
    optimizer.zero_grad(set_to_none=True)
    lp = logprobs("actor")
    ratio = torch.exp(lp - old)
    surrogate = -torch.min(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    delta = ref - lp
    k3 = torch.exp(delta) - delta - 1  # KL(pi || ref), GRPO's estimator
    per_token = torch.where(mask, surrogate + BETA * k3, torch.zeros_like(lp))
    counts = mask.sum(1)
    loss = (per_token.sum(1) / counts.clamp(min=1)).sum() / (counts > 0).sum()
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
    optimizer.step()
    return loss.detach()


def _grad_rel_diff(a: list[torch.nn.Parameter], b: list[torch.nn.Parameter]) -> float:
    diff = max(float((x.grad - y.grad).abs().max()) for x, y in zip(a, b, strict=True))
    scale = max(float(x.grad.abs().max()) for x in a)
    return diff / scale if scale > 0 else diff


def _variants(
    agent: GRPO, policy: PolicyModel, exp: Experience, losses: dict[str, float]
) -> list[tuple[str, Callable[[], None]]]:
    """``(name, one update)`` of each variant; each call stores its loss in ``losses``."""
    optimizer = torch.optim.AdamW(policy.trainable_parameters("actor"), lr=LR, weight_decay=0)

    def plain() -> None:
        losses["plain"] = float(_plain_step(policy, optimizer, exp))

    def learn() -> None:
        losses["rl_algos.learn"] = agent.learn((exp.ids, exp.action_mask, exp.rewards))["loss"]

    return [("plain", plain), ("rl_algos.learn", learn)]


def _max_rss_bytes() -> int:
    """This process's peak resident memory.

    Linux's ``VmHWM`` (the peak of this process image), since ``ru_maxrss`` of a child
    starts at its parent's resident size at ``fork`` (kept over ``exec``), which hides the
    worker's own peak when the parent already holds the models.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _worker(name: str, variant: str) -> dict[str, int]:
    """In a fresh process: peak RSS over one call minus the peak RSS before it.

    A call on a small batch first (one group, completions of 8 tokens) pays the one-time
    costs (lazy imports, thread pools, optimizer state) without raising the peak much.
    """
    torch.manual_seed(SEED)
    device = torch.device("cpu")
    agent = _agent(name, device)
    vocab = int(agent.policy.base_model.config.vocab_size)
    exp = _experience(vocab, device, prompts=1, completion_len=8)
    fn = dict(_variants(agent, agent.policy, exp, {}))[variant]
    fn()
    vars(exp).update(vars(_experience(vocab, device)))  # the closures read `exp`'s fields
    base = _max_rss_bytes()
    fn()
    return {"peak_extra_bytes": _max_rss_bytes() - base}


def _cpu_peak_extra_mib(name: str, variant: str) -> float | None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", name, variant],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        print(f"{name} {variant}: memory worker failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return round(int(result["peak_extra_bytes"]) / 2**20, 1)


def _cuda_peak_extra_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)


def run(quick: bool) -> list[Row]:
    repeats = 1 if quick else 5
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(SEED)
    rows: list[Row] = []
    for name in ("tiny", "20M"):
        agent = _agent(name, device)  # rl_algos.learn
        twin = _agent(name, device)  # the same weights, updated by the plain loop
        params_count = sum(
            p.numel() for n, p in agent.policy.base_model.named_parameters() if "lora_" not in n
        )
        lora_count = sum(p.numel() for p in agent.actor_parameters())
        exp = _experience(int(agent.policy.base_model.config.vocab_size), device)
        case = f"{name} ({params_count / 1e6:.1f}M params) {B}x{G}x{L}"
        losses: dict[str, float] = {}
        variants = _variants(agent, twin.policy, exp, losses)
        # warm-up once (on CUDA measuring the peak memory), then the timed calls
        peaks = {v: _cuda_peak_extra_mib(fn, device) for v, fn in variants}
        # the tiny model's calls take ~0.1 s: more of them steady the median
        n = repeats if quick or name != "tiny" else 4 * repeats + 1
        timings = {v: measure(fn, repeats=n, warmup=0, device=device) for v, fn in variants}
        rel = _grad_rel_diff(agent.actor_parameters(), twin.policy.trainable_parameters("actor"))
        del agent, twin, variants
        for variant, timing in timings.items():
            if device.type == "cpu" and not quick:  # peak RSS needs a process of its own
                peaks[variant] = _cpu_peak_extra_mib(name, variant)
            extra: dict[str, Any] = {"params": params_count, "lora_params": lora_count}
            if peaks[variant] is not None:
                extra["peak_extra_MiB"] = peaks[variant]
            extra["loss"] = f"{losses[variant]:.4g}"
            if variant != "plain":
                extra["grad_rel_diff"] = f"{rel:.1e}"
            rows.append(Row("learn", case, variant, timing, extra=extra))
    return with_memory_ratios(with_ratios(rows, baseline="plain"), baseline="plain")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    print(json.dumps(_worker(sys.argv[2], sys.argv[3])))
