"""MkDocs hook: serve MathJax from the site itself, fetched from the npm registry at build time.

The site must render its equations with no network (an air-gapped cluster, ``mkdocs serve`` on a
train), so MathJax is not loaded from a CDN and not committed either: on every build this hook
takes the ``mathjax`` npm package (``npm pack mathjax@MATHJAX_VERSION``, cached under
``.cache/docs/`` at the repository root) and copies its ``es5/`` bundle to
``<site>/javascripts/mathjax/``, which ``mkdocs.yml``'s ``extra_javascript`` points at. A build
with neither the cache nor ``npm`` fails with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

MATHJAX_VERSION = "3.2.2"
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "docs"


def mathjax_bundle(version: str = MATHJAX_VERSION, cache: Path = CACHE) -> Path:
    """The ``es5/`` folder of the ``mathjax`` npm package, fetched once into ``cache``."""
    target = cache / f"mathjax-{version}"
    es5 = target / "package" / "es5"
    if (es5 / "tex-mml-chtml.js").is_file():
        return es5
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "the docs vendor MathJax from the npm registry at build time and `npm` is not on "
            "PATH: install Node.js (apt-get install npm) and build again"
        )
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "pack", f"mathjax@{version}", "--pack-destination", str(cache), "--silent"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm pack mathjax@{version} failed:\n{done.stderr}")
    tarball = cache / f"mathjax-{version}.tgz"
    partial = cache / f"mathjax-{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(partial, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    tarball.unlink()
    return es5


def on_post_build(config: Any, **kwargs: Any) -> None:
    """Copy MathJax into ``<site>/javascripts/mathjax/``."""
    dest = Path(config["site_dir"]) / "javascripts" / "mathjax"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(mathjax_bundle(), dest)
