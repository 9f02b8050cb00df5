"""Run the documentation's ``gpu-only`` examples, on a machine with a CUDA GPU and the hub.

The CPU suite (``nox -s integration``, tests_integration/test_docs_pages.py) runs every python
block of the docs site except those marked ``<!-- docs: gpu-only: REASON -->``. This script runs
the pages that hold such a block, every block of the page in order (the marked ones included) in
one namespace, in a fresh temporary directory. ``.github/workflows/gpu.yml`` runs it:

    uv run --locked --all-packages --group test python tools/docs/gpu_examples.py
    uv run --locked --all-packages --group test python tools/docs/gpu_examples.py --list
    uv run ... python tools/docs/gpu_examples.py docs/tutorials/vllm.md   # one page
    uv run ... python tools/docs/gpu_examples.py --skip docs/tutorials/vllm.md

It needs ``rl_testing`` (the workspace's test-support member) and whatever the page needs
(vLLM, DeepSpeed, the models it downloads); a page that fails is reported and the exit status is 1.

Without network (a lent GPU machine), ``--stand-in 0.5b`` puts a random model of each hub
model's shape (:data:`HUB_MODELS`, with rl-testing's BPE tokenizer and its chat template) in a
temporary offline hub cache, so ``from_pretrained`` finds it, and ``--max-steps N`` rewrites the
pages' ``max_steps=`` and ``evaluation_interval=`` to ``N``; ``--stand-in tiny`` does the same
with a tiny model and moves ``device="cuda"`` and ``device_map="cuda"`` to the CPU (to check
the pages and this script without a GPU). What a page downloads besides a model (a dataset, a
classifier) still fails::

    python3 tools/docs/gpu_examples.py --stand-in 0.5b --max-steps 2 docs/algorithms/ppo.md
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The hub models the pages load, with the architecture of their random stand-ins.
HUB_MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
    },
}  # fmt: skip
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


def stand_in_cache(cache: Path, shape: str) -> None:
    """An offline hub cache under ``cache`` holding a random stand-in of each of HUB_MODELS."""
    from rl_testing.tokenizer import bpe_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = bpe_tokenizer()
    revision = "0" * 40
    for name, arch in HUB_MODELS.items():
        config = dict(arch) if shape == "0.5b" else {**TINY, "vocab_size": len(tokenizer)}
        config["vocab_size"] = max(config["vocab_size"], len(tokenizer))
        model = Qwen2ForCausalLM(Qwen2Config(
            **config, tie_word_embeddings=True, max_position_embeddings=4096,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ))  # fmt: skip
        repo = cache / f"models--{name.replace('/', '--')}"
        model.save_pretrained(repo / "snapshots" / revision)
        tokenizer.save_pretrained(repo / "snapshots" / revision)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
        print(f"stand-in for {name}: random {shape} model ({model.num_parameters():,} parameters)")


def rewrite(code: str, max_steps: int | None, device: str | None) -> str:
    """A block's code with ``max_steps``/``evaluation_interval`` and the CUDA device replaced."""
    if max_steps is not None:
        code = re.sub(r"\b(max_steps|evaluation_interval)=\d+", rf"\1={max_steps}", code)
    if device is not None:
        code = re.sub(r'\b(device|device_map)="cuda"', rf'\1="{device}"', code)
    return code


def gpu_pages(docs: Path) -> dict[Path, list[str]]:
    """Pages under ``docs`` with at least one ``gpu-only`` block, with the blocks' reasons."""
    from rl_testing.docs import python_blocks

    found: dict[Path, list[str]] = {}
    for page in sorted(docs.rglob("*.md")):
        reasons = [b.skip_reason for b in python_blocks(page) if b.skip_reason is not None]
        if reasons:
            found[page] = reasons
    return found


def run_page(page: Path, max_steps: int | None = None, device: str | None = None) -> None:
    """Execute every python block of ``page``, the gpu-only ones included, in one namespace."""
    from rl_testing.docs import python_blocks

    namespace: dict[str, object] = {"__name__": "__docs_gpu__"}
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="docs-gpu-") as tmp:
        os.chdir(tmp)
        try:
            for block in python_blocks(page):
                code = rewrite(block.code, max_steps, device)
                source = "\n" * (block.line - 1) + code  # the Markdown's line numbers
                exec(compile(source, str(page), "exec"), namespace)
        finally:
            os.chdir(here)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="gpu_examples.py", description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to run (default: all)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        type=Path,
        metavar="PAGE",
        help="leave this page out (one that needs another environment)",
    )
    parser.add_argument("--list", action="store_true", help="list the pages and reasons only")
    parser.add_argument(
        "--stand-in",
        choices=["0.5b", "tiny"],
        help="random stand-ins for the hub models, in an offline cache (tiny: on the CPU)",
    )
    parser.add_argument("--max-steps", type=int, help="rewrite max_steps= and evaluation_interval=")
    args = parser.parse_args(argv)
    found = gpu_pages(ROOT / "docs")
    skip = {p.resolve() for p in args.skip}
    pages = [p for p in ([p.resolve() for p in args.pages] or list(found)) if p not in skip]
    unknown = [p for p in [*pages, *skip] if p not in found]
    if unknown:
        names = ", ".join(str(p) for p in unknown)
        print(f"gpu_examples.py: error: no gpu-only block in {names}", file=sys.stderr)
        return 2
    if args.list:
        for page in pages:
            for reason in found[page]:
                print(f"{page.relative_to(ROOT)}: {reason}")
        return 0
    device = "cpu" if args.stand_in == "tiny" else None
    if args.stand_in:
        cache = Path(tempfile.mkdtemp(prefix="docs-hub-"))
        # before huggingface_hub is imported: it reads these once, into its constants
        os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        stand_in_cache(cache, args.stand_in)
    failed = []
    for page in pages:
        name = page.relative_to(ROOT)
        start = time.perf_counter()
        try:
            run_page(page, args.max_steps, device)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            print(f"FAILED {name}", flush=True)
        else:
            print(f"ok {name} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{len(pages) - len(failed)} of {len(pages)} pages ran")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
