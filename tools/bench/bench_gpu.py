"""GPU benchmark: the fused head kernels and one GRPO step at real model shapes.

Run by ``tools/gpu/run.py`` (``nox -s gpu``) on a CUDA device; ``--smoke`` runs every part at
toy shapes on whatever device there is (CPU in CI), to check the script, not to measure.

Part 1, the head (``H`` hidden, ``V`` vocabulary, ``M`` tokens in sequences of 512; bf16 hidden
states and weight, as a bf16 model's last layer gives them), forward + backward of a clipped
policy loss (``clip_low`` 0.2, ``clip_high`` 0.28, token mean) on the log-probs of ``M`` targets:

* ``naive``: full ``[M, V]`` bf16 logits, float32 ``log_softmax``, gather, ``rl_losses``;
* ``fused``: ``rl_kernels.fused_policy_loss`` (float32 softmax and loss, chunked, no full
  logits; on CUDA the GEMMs take the bf16 operands with float32 results), and ``fused-16MiB``
  the same with ``memory_budget`` 16 MiB (smaller tiles), and ``fused-tiles`` with the logits
  split over the vocabulary too (``vocab_chunk`` 2,048, 8 MiB tiles);
* ``liger``: Liger's ``LigerFusedLinearGRPOLoss`` (``loss_type="dapo"``, ``beta=0``), eager,
  when ``liger_kernel`` imports.

Each with the head frozen (LoRA: no weight gradient) and trainable (full fine-tuning). Time:
median of ``--repeats`` after a warm-up, with the device synchronised; peak memory: the
largest allocation above what the inputs hold (``torch.cuda.max_memory_allocated``; not
measured on CPU).

Part 2, one GRPO step of a random Qwen2 of Qwen2.5-0.5B's shape (24 layers, ``H`` 896,
intermediate 4864, 14 heads, 2 KV heads, ``V`` 151936; bf16) with LoRA r16 on the seven
projections: ``learn()`` on 16 ragged rows of up to 512 tokens (groups of 4 repeating a prompt
of 128), padded, packed (the default: each group's prompt computed once, ``share_prompt_prefix``)
and packed with every row computing its own prompt, and ``get_action`` (4 prompts x 4 samples,
128 new tokens); ``learn()`` packed again with gradient checkpointing (its MFU counts the useful
FLOPs only, not the recomputation nor the shared prompts' saving: the same FLOPs for every
variant). Reported: seconds,
real tokens per second, and MFU against the bf16 matmul peak measured in the same run (``torch.mm`` of 8192^3,
best of 5), with the FLOPs of ``learn()`` counted as ``6 P t + 6 H V c``: a reference forward,
a policy forward and its input-gradient backward (2 each) over the ``P`` decoder weights for
``t`` real tokens, and the same three passes of the head for the ``c`` completion tokens; the
frozen base needs no weight gradient and attention's own FLOPs (under 5% at 512 tokens) are
left out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: (name, H, V, M): Qwen2.5-0.5B's and Qwen2.5-7B's heads.
HEADS = [("qwen2.5-0.5b", 896, 151936, 8192), ("qwen2.5-7b", 3584, 152064, 4096)]
SMOKE_HEADS = [("smoke", 64, 1000, 1024)]
#: Qwen2.5-0.5B's decoder (random weights).
MODEL = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
         "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}  # fmt: skip
SMOKE_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip
SEQ = 512
CLIP = {"clip_low": 0.2, "clip_high": 0.28}
#: ``memory_budget`` of the ``fused-16MiB`` variant: smaller tiles, for the memory it saves.
LOW_BUDGET = 16 * 2**20
#: ``fused-tiles``: tiles of 2,048 vocabulary columns (``vocab_chunk``) within 8 MiB each.
TILE_COLUMNS, TILE_BUDGET = 2048, 8 * 2**20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls after one warm-up, the device synchronised around each."""
    fn()
    out = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - start)
    return out


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak allocation of one call above what was allocated before it (None on CPU)."""
    if device.type != "cuda":
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int) -> float:
    """Best FLOP/s of ``torch.mm`` of two ``[size, size]`` matrices (best of 5)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = min(timed(lambda: torch.mm(a, b), device, 5))
    return 2.0 * size**3 / best


def _liger_loss() -> Any | None:
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except Exception:
        return None
    return LigerFusedLinearGRPOLoss(
        beta=0.0, compiled=False, use_ref_model=False, epsilon_low=0.2, epsilon_high=0.28,
        loss_type="dapo", chunk_size=1,
    )  # fmt: skip


def _head_variants(
    hl: torch.Tensor, wl: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
    adv: torch.Tensor, old: torch.Tensor, liger: Any | None,
) -> dict[str, Callable[[], None]]:  # fmt: skip
    """naive / fused / liger: one forward + backward of the policy loss through the head."""
    import rl_kernels as rk
    import rl_losses as rl

    def naive() -> None:
        logits = hl @ wl.T  # [n, t, V] in the model's dtype
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
        rl.clipped_surrogate(logp, old, adv, mask, aggregation="token_mean", **CLIP).loss.backward()

    def fused(budget: int = rk.DEFAULT_MEMORY_BUDGET, columns: int | None = None) -> None:
        rk.fused_policy_loss(hl, wl, targets, mask, adv, old, aggregation="token_mean",
                             memory_budget=budget, vocab_chunk=columns,
                             **CLIP).loss.backward()  # fmt: skip

    variants: dict[str, Callable[[], None]] = {
        "naive": naive,
        "fused": fused,
        "fused-16MiB": lambda: fused(LOW_BUDGET),
        "fused-tiles": lambda: fused(TILE_BUDGET, TILE_COLUMNS),
    }
    if liger is not None:

        def liger_step() -> None:
            out = liger(hl, wl, targets, mask.long(), adv, old_per_token_logps=old)
            (out[0] if isinstance(out, tuple) else out).backward()

        variants["liger"] = liger_step
    return variants


def head_part(
    device: torch.device, dtype: torch.dtype, heads: list[Any], repeats: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    liger = _liger_loss()
    for name, h, v, m in heads:
        n, t = max(m // SEQ, 1), min(m, SEQ)
        g = torch.Generator(device=device).manual_seed(0)
        hidden = torch.randn(n, t, h, device=device, generator=g).to(dtype)
        weight = (torch.randn(v, h, device=device, generator=g) * h**-0.5).to(dtype)
        targets = torch.randint(0, v, (n, t), device=device, generator=g)
        mask = torch.ones(n, t, dtype=torch.bool, device=device)
        adv = torch.randn(n, device=device, generator=g)
        old = torch.full((n, t), -float(torch.log(torch.tensor(float(v)))), device=device)
        for trainable in (False, True):
            hl = hidden.clone().requires_grad_(True)
            wl = weight.clone().requires_grad_(trainable)
            variants = _head_variants(hl, wl, targets, mask, adv, old, liger)
            for variant, fn in variants.items():
                samples = timed(fn, device, repeats)
                peak = peak_mib(fn, device)
                hl.grad = None
                wl.grad = None
                rows.append({"part": "head", "case": f"{name} H={h} V={v} M={m} {dtype}",
                             "head": "trainable" if trainable else "frozen", "variant": variant,
                             "median_ms": 1e3 * statistics.median(samples), "peak_MiB": peak})  # fmt: skip
    for r in rows:
        base = next(x for x in rows if x["case"] == r["case"] and x["head"] == r["head"]
                    and x["variant"] == "naive")  # fmt: skip
        r["time_vs_naive"] = r["median_ms"] / base["median_ms"]
        r["mem_vs_naive"] = None if r["peak_MiB"] is None else r["peak_MiB"] / base["peak_MiB"]
    return rows


def _batch(
    rows: int, length: int, vocab: int, group: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [rows, L], action masks [rows, L-1], rewards [rows]): prompts of L/4, each repeated
    by the ``group`` rows of a GRPO group, ragged ends."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (rows, length), generator=g)
    ids[:, : length // 4] = ids[::group, : length // 4].repeat_interleave(group, 0)[:rows]
    ends = torch.randint(length // 2, length + 1, (rows,), generator=g)
    masks = torch.zeros(rows, length - 1, dtype=torch.bool)
    for r in range(rows):
        ids[r, int(ends[r]) :] = 0
        masks[r, length // 4 - 1 : int(ends[r]) - 1] = True
    return ids, masks, torch.randn(rows, generator=g)


def step_part(device: torch.device, dtype: torch.dtype, shape: dict[str, int], smoke: bool,
              peak: float) -> list[dict[str, Any]]:  # fmt: skip
    from peft import LoraConfig
    from rl_algos import GRPO
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True)

    def build() -> Qwen2ForCausalLM:
        """The same random weights each call, initialised on the device (fast at 0.5B)."""
        torch.manual_seed(0)
        with torch.device(device):
            return Qwen2ForCausalLM(cfg).to(dtype)

    rows_n, length, new_tokens = (16, 64, 8) if smoke else (16, SEQ, 128)
    ids, masks, rewards = _batch(rows_n, length, cfg.vocab_size)
    real_tokens = int((ids != 0).sum())
    completion_tokens = int(masks.sum())
    with torch.device("meta"):
        decoder = sum(p.numel() for n, p in Qwen2ForCausalLM(cfg).named_parameters()
                      if ".layers." in n and p.dim() == 2)  # fmt: skip
    head = cfg.hidden_size * cfg.vocab_size
    flops = 6 * decoder * real_tokens + 6 * head * completion_tokens
    out: list[dict[str, Any]] = []
    variants = (  # (label, use_sequence_packing, gradient_checkpointing, share_prompt_prefix)
        ("padded", False, False, None),
        ("packed", True, False, None),  # each group's prompt computed once (the default)
        ("packed-unshared", True, False, False),
        ("packed+checkpointing", True, True, None),
    )
    for label, packing, checkpointing, share in variants:
        model = build()
        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # fmt: skip
        agent = GRPO(actor_network=model, pad_token_id=0, pad_token="<pad>", group_size=4,
                     batch_size=rows_n, lora_config=lora, beta=0.04, update_epochs=1, seed=0,
                     device=str(device), use_sequence_packing=packing,
                     gradient_checkpointing=checkpointing, share_prompt_prefix=share,
                     max_output_tokens=new_tokens,
                     min_output_tokens=new_tokens)  # fmt: skip
        batch = (ids, masks, rewards)
        learn = timed(lambda a=agent, b=batch: a.learn(tuple(x.clone() for x in b)), device, 2)
        learn_peak = peak_mib(lambda a=agent, b=batch: a.learn(tuple(x.clone() for x in b)), device)
        s = statistics.median(learn)
        out.append({"part": "step", "case": "learn", "variant": label, "median_s": s,
                    "tokens_per_s": real_tokens / s, "mfu": flops / s / peak,
                    "peak_MiB": learn_peak, "real_tokens": real_tokens})  # fmt: skip
        if label == "packed":
            prompts = [{"input_ids": ids[i : i + 1, : length // 4],
                        "attention_mask": torch.ones(1, length // 4, dtype=torch.long)}
                       for i in range(0, rows_n, 4)]  # fmt: skip
            act = timed(lambda a=agent, p=prompts: a.get_action(p), device, 2)
            s = statistics.median(act)
            out.append({"part": "step", "case": "get_action", "variant": "generate",
                        "median_s": s, "tokens_per_s": rows_n * new_tokens / s})  # fmt: skip
        del agent, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="toy shapes on any device (CI)")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--parts", default="head,step", help="comma-separated: head, step")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("bench_gpu: no CUDA device; run with --smoke for the toy shapes", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = 1024 if args.smoke else 8192
    peak = matmul_peak(device, dtype, size)
    machine = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else
               platform.processor() or platform.machine(), "torch": torch.__version__,
               "dtype": str(dtype), "matmul_peak_tflops": peak / 1e12, "smoke": args.smoke,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    print(json.dumps(machine), flush=True)
    rows: list[dict[str, Any]] = []
    parts = set(args.parts.split(","))
    if "head" in parts:
        rows += head_part(
            device, dtype, SMOKE_HEADS if args.smoke else HEADS, 1 if args.smoke else 5
        )
    if "step" in parts:
        rows += step_part(device, dtype, SMOKE_MODEL if args.smoke else MODEL, args.smoke, peak)
    from rl_kernels import _core

    machine["addmm_into_fp32"] = _core._ADDMM_INTO_FP32[0]  # the weight gradient's product
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
