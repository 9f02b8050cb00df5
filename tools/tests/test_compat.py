"""tools/compat.py: the version sets ``nox -s compat`` installs, and the table docs/versions.md shows."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import compat
import pytest
import release

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_is_the_declared_ranges() -> None:
    text = (ROOT / "docs" / "versions.md").read_text()
    shown = re.search(r"<!-- compat-table -->\n(.*?)\n<!-- /compat-table -->", text, re.S)
    assert shown is not None, "docs/versions.md lost its compat-table markers"
    assert shown.group(1) == compat.table(), (
        "run `python tools/compat.py table` into docs/versions.md"
    )


def test_vllm_pins_are_the_locked_vllm_releases_dependencies() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (vllm,) = [p for p in lock["package"] if p["name"] == "vllm"]
    torch = [d for d in vllm["dependencies"] if d["name"] == "torch"]
    pins = compat.vllm_pins()
    assert set(pins) == set(compat.VLLM_PINNED)
    assert [d.get("version", pins["torch"]) for d in torch] == [pins["torch"]]
    # the newest torch in the lock is not vLLM's: the set is a real second end
    newest = max(
        (p["version"] for p in lock["package"] if p["name"] == "torch"),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    assert compat._release(pins["torch"]) <= compat._release(newest)


def test_every_package_is_tested_at_its_floors_and_at_vllms_pins() -> None:
    floors = set(compat.SETS["floor-light"].tests) | set(compat.SETS["floor"].tests)
    assert floors == set(release.packages())
    assert set(compat.SETS["vllm"].tests) == set(release.packages())
    for vset in compat.SETS.values():
        installed = {compat._name(t) for t in vset.install}
        assert set(vset.tests) <= installed, vset.name
    assert compat.SETS["floor-light"].tests == tuple(compat.LIGHT)


def test_direct_requirements_follow_the_extras_installed() -> None:
    reqs = compat.direct_requirements(compat.SETS["floor"])
    names = {compat._name(r) for r in reqs}
    assert {"torch", "transformers", "peft", "deepspeed", "wandb", "trackio"} <= names
    assert "liger-kernel" not in names  # rl-kernels without its extra in this set
    light = {compat._name(r) for r in compat.direct_requirements(compat.SETS["floor-light"])}
    assert light == {"torch", "liger-kernel"}


@pytest.mark.parametrize(
    ("installed", "expected"),
    [("2.4.0", []), ("2.4", []), ("2.5.1", ["declare torch>=2.5.1"])],
)
def test_a_floor_the_resolver_lifts_is_reported(installed: str, expected: list[str]) -> None:
    vset = compat.VersionSet("t", ("rl-losses",), ("rl-losses",), "lowest-direct")
    problems = compat.unreachable_floors(vset, {"torch": installed})
    assert len(problems) == len(expected)
    for problem, fix in zip(problems, expected, strict=True):
        assert fix in problem and "rl-losses declares torch>=2.4" in problem


def test_only_the_tested_packages_floors_are_checked() -> None:
    # rl-losses is installed in the floor set as a dependency: its torch>=2.4 is lifted to 2.6
    vset = compat.SETS["floor"]
    problems = compat.unreachable_floors(vset, {"torch": "2.6.0"})
    assert problems == []
    problems = compat.unreachable_floors(vset, {"torch": "2.7.0"})
    assert problems and all("declares torch>=2.6" in p for p in problems)
