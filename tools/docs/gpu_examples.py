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
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def gpu_pages(docs: Path) -> dict[Path, list[str]]:
    """Pages under ``docs`` with at least one ``gpu-only`` block, with the blocks' reasons."""
    from rl_testing.docs import python_blocks

    found: dict[Path, list[str]] = {}
    for page in sorted(docs.rglob("*.md")):
        reasons = [b.skip_reason for b in python_blocks(page) if b.skip_reason is not None]
        if reasons:
            found[page] = reasons
    return found


def run_page(page: Path) -> None:
    """Execute every python block of ``page``, the gpu-only ones included, in one namespace."""
    from rl_testing.docs import python_blocks

    namespace: dict[str, object] = {"__name__": "__docs_gpu__"}
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="docs-gpu-") as tmp:
        os.chdir(tmp)
        try:
            for block in python_blocks(page):
                source = "\n" * (block.line - 1) + block.code  # the Markdown's line numbers
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
    failed = []
    for page in pages:
        name = page.relative_to(ROOT)
        start = time.perf_counter()
        try:
            run_page(page)
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
