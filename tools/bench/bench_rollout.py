"""HFEngine against a bare ``model.generate`` on the same batch and sampling settings (CPU).

Both sample 8 prompts x 4 completions x 32 new tokens with temperature 0.8, top-k 20,
top-p 0.95, from a random tiny model (~80k parameters) and a random ~20M-parameter Qwen2.
``HFEngine`` is measured without and with sampling log-probs; ``bare`` is one
``model.generate`` call with HF's own warpers and ``num_return_sequences=4``.
"""

from __future__ import annotations

import torch
from harness import Row, measure, with_ratios
from rl_rollout import HFEngine, SamplingParams
from rl_testing.models import tiny_causal_lm

PROMPTS = ["1+1=", "2+2=", "hello", "what is 7*6?", "abc", "x=", "tell me", "9-3="]


def _models() -> list[tuple[str, torch.nn.Module, object]]:
    tiny, tok = tiny_causal_lm("qwen2", seed=0)
    mid, _ = tiny_causal_lm(
        "qwen2", tokenizer=tok, seed=0, hidden_size=512, intermediate_size=1365,
        num_hidden_layers=7, num_attention_heads=8, num_key_value_heads=2,
    )  # fmt: skip
    return [("tiny", tiny, tok), ("20M", mid, tok)]


def run(quick: bool) -> list[Row]:
    repeats, warmup = (3, 1) if quick else (9, 2)
    rows: list[Row] = []
    for name, model, tok in _models():
        params_count = sum(p.numel() for p in model.parameters())
        case = f"{name} ({params_count / 1e6:.1f}M params) 8x4x32"
        engine = HFEngine(model, tok)
        sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.95, max_new_tokens=32, n=4, seed=0)
        sp_lp = SamplingParams(**{**sp.__dict__, "return_logprobs": True})
        enc = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]  # type: ignore[operator]
        width = max(len(e) for e in enc)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in enc])  # type: ignore[attr-defined]
        mask = (
            torch.arange(width) >= (width - torch.tensor([len(e) for e in enc]))[:, None]
        ).long()

        def bare(
            ids: torch.Tensor = ids,
            mask: torch.Tensor = mask,
            model: object = model,
            tok: object = tok,
        ) -> None:
            torch.manual_seed(0)
            with torch.no_grad():
                model.generate(  # type: ignore[attr-defined]
                    input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.8,
                    top_k=20, top_p=0.95, max_new_tokens=32, num_return_sequences=4,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
                )  # fmt: skip

        for variant, fn in (
            ("bare", bare),
            ("HFEngine", lambda e=engine, p=sp: e.generate(PROMPTS, p)),
            ("HFEngine+logprobs", lambda e=engine, p=sp_lp: e.generate(PROMPTS, p)),
        ):
            rows.append(Row("rollout", case, variant, measure(fn, repeats=repeats, warmup=warmup)))
    return with_ratios(rows, baseline="bare")
