"""The CUDA tests and the GPU benchmark, with the machine's Python and the workspace's sources.

``nox -s gpu`` runs this with the Python that runs nox; on a GPU machine without network or uv,
run it directly with the machine's own Python (which has torch, transformers, peft and
accelerate)::

    python3 tools/gpu/run.py --out results/       # the CUDA tests, then tools/bench/bench_gpu.py

Nothing is installed: where the ``rl_*`` packages do not import, their ``src`` folders go on
``PYTHONPATH`` with a stub ``*.dist-info`` each (their ``__init__`` reads its version from the
metadata). Steps:

1. ``pytest -m cuda`` over :data:`CUDA_TESTS` (``rl_testing.devices``' ``cuda`` cases: fused
   kernels in float32, bfloat16 and float16, the lean forwards, the engine, GRPO's ``learn()``
   padded, packed, checkpointed and offloaded, and LLMPPO's (critic and value head),
   LLMREINFORCE's and ILQL's (its heads), each against a float64 CPU reference; a
   mixture of experts' load-balancing loss and its gradient against transformers' own on CPU;
   ``rl-train run`` on the device: training, evaluation, a checkpoint and resuming from it).
2. ``tools/bench/bench_gpu.py``: the fused head against the full logits and Liger, and a GRPO
   step of a Qwen2.5-0.5B-shaped model (JSON rows under ``--out``).

Without a CUDA device, step 1 reports every case skipped with its reason and step 2 runs its
toy-shape smoke on the CPU (``--smoke``): the script and the tests are checked, nothing is
measured. The exit status is 0 only when both steps pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["advantages", "losses", "kernels", "adapters", "rollout", "envs", "algos", "train"]
#: The test files with ``cuda`` cases (``rl_testing.devices``).
CUDA_TESTS = [
    "packages/rl-advantages/tests/test_devices.py",
    "packages/rl-losses/tests/test_dtype_device.py",
    "packages/rl-kernels/tests/test_devices.py",
    "packages/rl-adapters/tests/test_devices.py",
    "packages/rl-rollout/tests/test_devices.py",
    "packages/rl-algos/tests/test_devices.py",
    "packages/rl-algos/tests/test_router_balance.py",
    "packages/rl-train/tests/test_devices.py",
]
#: Each test folder imports its ``*_testlib`` by name (the conftests put the folder on the path).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def source_env(site: Path, force: bool = False) -> dict[str, str]:
    """``os.environ``, plus the workspace's sources on PYTHONPATH where it is not installed.

    With ``force`` the sources go first even where it is installed.
    """
    env = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not force and all(importlib.util.find_spec(f"rl_{p}") for p in [*PACKAGES, "testing"]):
        return env
    folders = [*(ROOT / "packages" / f"rl-{p}" for p in PACKAGES), ROOT / "tools" / "rl-testing"]
    for folder in folders:
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        name, version = project["name"], project["version"]
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    paths = [str(site), *(str(ROOT / "packages" / f"rl-{p}" / "src") for p in PACKAGES)]
    paths.append(str(ROOT / "tools" / "rl-testing" / "src"))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    print(f"gpu: the workspace from source ({len(paths)} paths on PYTHONPATH)", flush=True)
    return env


def main(argv: list[str] | None = None) -> int:
    """Both steps; 0 only when both pass."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out",
        type=Path,
        help="folder for gpu.json, the benchmark rows (default: tools/bench/results on CUDA, "
        "a temporary folder for the CPU smoke)",
    )
    p.add_argument("--only", choices=["tests", "bench"], help="run one step")
    p.add_argument(
        "--from-source",
        action="store_true",
        help="the sources on PYTHONPATH even where the packages are installed",
    )
    args, pytest_args = p.parse_known_args(argv)  # the rest goes to pytest (e.g. -k fused)
    with tempfile.TemporaryDirectory(prefix="rl-gpu-") as tmp:
        env = source_env(Path(tmp), force=args.from_source)
        probe = (
            "import torch; c = torch.cuda.is_available(); "
            "print(torch.__version__, c, torch.cuda.get_device_name(0) if c else 'no CUDA device')"
        )
        info = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, check=True).stdout.split(maxsplit=2)  # fmt: skip
        cuda = info[1] == "True"
        print(f"gpu: torch {info[0]}, {info[2].strip()}", flush=True)
        status = 0
        if args.only in (None, "tests"):
            cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "cuda", "-rs",
                   *CUDA_TESTS, *pytest_args]  # fmt: skip
            status |= subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
        if args.only in (None, "bench"):
            folder = args.out or (ROOT / "tools" / "bench" / "results" if cuda else Path(tmp))
            out = folder / ("gpu.json" if cuda else "gpu-smoke.json")
            cmd = [
                sys.executable,
                str(ROOT / "tools" / "bench" / "bench_gpu.py"),
                "--out",
                str(out),
            ]
            if not cuda:
                cmd.append("--smoke")
                print("gpu: no CUDA device: the benchmark runs its CPU smoke (nothing measured)")
            status |= subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    if not cuda:
        print("gpu: no CUDA device: the CUDA cases were skipped (reasons above); the GPU run is"
              " pending a machine with one")  # fmt: skip
    return status


if __name__ == "__main__":
    raise SystemExit(main())
