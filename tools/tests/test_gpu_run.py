"""tools/gpu/run.py, which ``nox -s gpu`` runs: its list of CUDA test files and its source mode.

The list must name every test file with ``cuda`` cases (a file added without it would never run
on a GPU), and the source mode must give each package the metadata its ``__init__`` reads.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import run  # noqa: E402


def _uses_devices(path: Path) -> bool:
    text = path.read_text()
    return "rl_testing.devices" in text or "pytest.mark.cuda" in text


def test_the_list_names_every_file_with_cuda_cases() -> None:
    found = {
        str(p.relative_to(ROOT))
        for p in [
            *ROOT.glob("packages/*/tests/test_*.py"),
            *ROOT.glob("tests_integration/test_*.py"),
        ]
        if _uses_devices(p)
    }
    assert found == set(run.CUDA_TESTS), (sorted(found - set(run.CUDA_TESTS)),
                                          sorted(set(run.CUDA_TESTS) - found))  # fmt: skip


def test_source_mode_puts_every_package_and_its_metadata_on_the_path(tmp_path: Path) -> None:
    env = run.source_env(tmp_path, force=True)
    paths = env["PYTHONPATH"].split(":")
    assert paths[0] == str(tmp_path)
    for package in run.PACKAGES:
        folder = ROOT / "packages" / f"rl-{package}"
        assert str(folder / "src") in paths, package
        version = tomllib.loads((folder / "pyproject.toml").read_text())["project"]["version"]
        meta = tmp_path / f"rl_{package}-{version}.dist-info" / "METADATA"
        assert f"Name: rl-{package}\nVersion: {version}\n" in meta.read_text(), package
    assert env["HF_HUB_OFFLINE"] == "1"
