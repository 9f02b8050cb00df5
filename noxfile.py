"""Task runner for the rl-* workspace (nox with the uv backend).

Plain ``nox`` runs the default sessions: lint, typecheck, tools, every ``test-<package>``,
isolation, compat-light, gpu, integration (which also executes every Python example of the docs
site), slow, docs and docs-browser. ``nox -s affected -- origin/main...HEAD`` runs only those a
change needs.
Environments are synced from the committed ``uv.lock`` (``--locked``): a stale lock fails
instead of being rewritten.

Sessions:
    test-<package>   that package's unit tests, in an environment holding only the package, its
                     declared dependencies and its ``test`` group (an undeclared import fails);
                     line coverage where ``COVERAGE_FLOOR`` sets a floor
    coverage         (not default) every package's line coverage by its unit tests
    lint             ruff check + ruff format --check
    typecheck        mypy (strict for rl-advantages, rl-losses, rl-kernels)
    isolation        wheels of the torch-only packages in fresh venvs: import, compute, and no
                     transformers/peft/accelerate/datasets
    compat-light     rl-advantages, rl-losses, rl-kernels from wheels at their floors (every direct
                     dependency at the lowest version it admits), their unit tests
    compat           (not default) both ends of the declared ranges: ``floor-light``, ``floor``
                     (all packages, extras, the DeepSpeed tests) and ``vllm`` (torch and
                     transformers as the locked vLLM pins them); docs/versions.md
    integration      tests_integration/ (not slow)
    slow             every test marked ``slow`` (DeepSpeed ZeRO-2/3, SIGKILL + resume, ...)
    capabilities     (not default) unit, integration and slow tests under each CPU kernel width
                     (``ATEN_CPU_CAPABILITY`` avx512 / avx2 + ``MKL_ENABLE_INSTRUCTIONS=AVX2`` /
                     default): what another x86-64 machine computes (docs/testing.md)
    gpu              the CUDA cases of the tests (``pytest -m cuda``, rl_testing.devices) and
                     tools/bench/bench_gpu.py, with nox's own interpreter and the workspace from
                     source (tools/gpu/run.py; nothing installed, so it runs offline on a GPU
                     machine); without CUDA the cases skip with their reason and the benchmark
                     runs a CPU smoke (docs/benchmarks.md, "GPU")
    bench            tools/bench/ benchmarks (medians and ratios; see tools/bench/README.md)
    bench-peers      one GRPO step of ours against TRL and AgileRL (each in a throwaway venv
                     outside the workspace) and bare generate, side by side (not default)
    conformance      (not default) our estimators and losses against verl, OpenRLHF, TRL, Liger and
                     AgileRL's released code, each in a throwaway venv under ~/.cache/rl-conformance
                     (RL_CONFORMANCE_HOME); writes docs/conformance.md (tools/conformance/run.py)
    tinker-cookbook  (not default) the unmodified tinker-cookbook math RL recipe (0.5.8, in a venv
                     of its own) for 2 steps against ``rl-train tinker-server`` on a tiny model
                     (tools/tinker_cookbook_check.py)
    docs             mkdocs build --strict (the site's examples run in ``integration``)
    docs-browser     the built site opened in the system's Chromium (tools/docs/browser_check.py):
                     rendered math, no console error, no broken link, load times reported;
                     screenshots in .nox/docs-browser/screenshots; skips when no Chromium is
                     installed (``.ci/run`` installs Debian's ``chromium``)
    build-<package>  wheel + sdist into dist/<package> with --no-sources, installed in a fresh venv
    tools            tools/tests: tools/affected.py on scratch git repos, the GitHub workflows
                     against their schema, release.py check-tag (the release dry run is ``slow``)
    affected         not a default: ``nox -s affected -- origin/main...HEAD`` runs exactly the
                     sessions that change needs (tools/affected.py; the same list CI runs)
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import affected  # noqa: E402  (tools/affected.py: which packages and sessions a change needs)
import compat  # noqa: E402  (tools/compat.py: the ends of the declared dependency ranges)
import release  # noqa: E402  (tools/release.py: build, smoke and package helpers)

nox.needs_version = ">=2025.5"
nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"

PACKAGES = release.packages()
#: Packages that must install with torch and nothing heavier (docs/architecture.md).
TORCH_ONLY = affected.LIGHT
#: What a torch-only package must never pull in.
FORBIDDEN_IN_TORCH_ONLY = ["transformers", "peft", "accelerate", "datasets"]
#: Sources type-checked by mypy (tests are exercised by pytest instead).
#: Line-coverage floors per package (``--cov-fail-under``), checked by its ``test-<package>``
#: session. Only these sessions trace coverage: the tracer of Python 3.11 makes a suite up to
#: 1.7x slower (rl-losses, rl-algos; docs/testing.md), so ``nox -s coverage`` reports the rest.
COVERAGE_FLOOR = {"rl-advantages": 95}
TYPED_SOURCES = [
    *(f"packages/{p}/src" for p in PACKAGES),
    "tools/rl-testing/src",
    "tools/release.py",
    "tools/affected.py",
    "noxfile.py",
]


#: Where the sessions' Python writes bytecode when ``PYTHONDONTWRITEBYTECODE`` is set (``sync``).
PYCACHE = ROOT / ".nox" / "pycache"
#: Every session runs with the Hugging Face libraries offline: nothing is downloaded at run time
#: (tests build their models, tokenizers and datasets), and a call that would reach the hub fails
#: at once instead of after huggingface_hub's HTTP retries (23 s of backoff per call here).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def sync(session: nox.Session, *args: str) -> None:
    """Sync the session venv from uv.lock with exactly the given packages/groups.

    Bytecode: pyproject.toml has uv compile every installed file (``compile-bytecode``) for the
    root environment's start-ups (``uv run rl-train demo``) where ``PYTHONDONTWRITEBYTECODE``
    keeps Python from writing ``.pyc`` files. A test session imports a fraction of its
    6,000-18,000 files, so its install skips that compile (15-48 s a session on 2 cores,
    docs/testing.md) and Python writes the ``.pyc`` of what the session imports, on first import.
    Where ``PYTHONDONTWRITEBYTECODE`` is set, the session's processes write them anyway, under
    ``.nox/pycache`` (``PYTHONPYCACHEPREFIX``) rather than next to any source: without them every
    test process and every process a test launches would recompile torch's sources at start.
    """
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--exact",
        "--no-default-groups",
        "--no-compile-bytecode",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )
    session.env.update(OFFLINE)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        session.env["PYTHONDONTWRITEBYTECODE"] = ""  # Python: only a non-empty value disables
        session.env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)


#: pytest-xdist: one worker per CPU, each test file on one worker (the files' tests share
#: module fixtures and run in order). Every test runs with one torch thread
#: (``rl_testing.fixtures.single_torch_thread``), so the workers fill the cores without
#: oversubscribing them; ``-- -n 0`` runs in one process. Multi-process tests (torchrun,
#: DeepSpeed, rollout workers) then share the cores with the other worker: their timeouts are
#: hang guards, minutes beyond their run time.
XDIST = ["-n", "auto", "--dist", "loadfile"]
#: integration and slow: a few long tests (the learning table, DeepSpeed launches) dominate, so
#: tests go to whichever worker is free; a file whose tests share state in order is one
#: ``xdist_group`` (test_release.py's workspace).
XDIST_BY_TEST = ["-n", "auto", "--dist", "loadgroup"]


def _test_session(package: str, directory: str) -> None:
    @nox.session(name=f"test-{package}", tags=["test"])
    def test(session: nox.Session) -> None:
        sync(session, "--package", package, "--group", "test")
        session.run("uv", "pip", "list", "--python", session.virtualenv.location, silent=False)
        cov = []
        if package in COVERAGE_FLOOR:
            cov = [
                f"--cov={package.replace('-', '_')}",
                "--cov-report=term-missing:skip-covered",
                f"--cov-fail-under={COVERAGE_FLOOR[package]}",
            ]
        session.run(
            "pytest", f"{directory}/tests", "-m", "not slow", *XDIST, *cov, *session.posargs
        )


for _pkg in PACKAGES:
    _test_session(_pkg, f"packages/{_pkg}")
_test_session("rl-testing", "tools/rl-testing")


@nox.session(default=False)
def coverage(session: nox.Session) -> None:
    """Line coverage of every package by its own unit tests, in one environment (not default).

    The floors of ``COVERAGE_FLOOR`` are checked by the ``test-<package>`` sessions.
    """
    sync(session, "--all-packages", "--group", "test")
    dirs = [f"packages/{p}/tests" for p in PACKAGES]
    modules = [f"--cov={p.replace('-', '_')}" for p in [*PACKAGES, "rl-testing"]]
    session.run(
        "pytest", *dirs, "tools/rl-testing/tests", "-m", "not slow", *XDIST, *modules,
        "--cov-report=term-missing:skip-covered", *session.posargs,
    )  # fmt: skip


@nox.session(tags=["lint"])
def lint(session: nox.Session) -> None:
    sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(tags=["lint"])
def typecheck(session: nox.Session) -> None:
    sync(session, "--all-packages", "--group", "typecheck", "--group", "test")
    # mypy's worker processes (mypy >= 2.0, ``--num-workers``): 107 s instead of 131 s on 2
    # cores (docs/testing.md, "CI time"); more workers than cores do not help (mypy's docs)
    workers = min(2, os.cpu_count() or 1)
    session.run("mypy", *(["--num-workers", str(workers)] if workers > 1 else []), *TYPED_SOURCES)


@nox.session
def isolation(session: nox.Session) -> None:
    """Each torch-only package's wheel, alone in a fresh venv, imports, computes, stays light.

    ``nox -s isolation -- rl-losses`` checks only the packages named (``nox -s affected`` does).
    """
    unknown = sorted(set(session.posargs) - set(TORCH_ONLY))
    if unknown:
        session.error(f"isolation -- {' '.join(unknown)}: not torch-only; choose from {TORCH_ONLY}")
    work = Path(session.create_tmp()).resolve() / "isolation"
    for package in [p for p in TORCH_ONLY if p in session.posargs or not session.posargs]:
        wheel_dir = work / "dist" / package
        release.build(package, wheel_dir)
        got = release.smoke(
            package, dist=wheel_dir, forbidden=FORBIDDEN_IN_TORCH_ONLY, work=work / package
        )
        ours = sorted(n for n in got if n.startswith("rl-"))
        session.log(f"{package}: {len(got)} distributions installed; ours: {ours}")
        expected = sorted([package, *release.workspace_deps(package)])
        if ours != expected:
            session.error(f"{package}: expected workspace packages {expected}, got {ours}")


def _compat(session: nox.Session, name: str) -> None:
    """Install one end of the declared ranges (tools/compat.py) from our wheels; run the tests."""
    vset = compat.SETS[name]
    work = Path(session.create_tmp()).resolve() / f"compat-{name}"
    house = work / "wheelhouse"
    if house.exists():
        shutil.rmtree(house)
    ours = sorted({affected._req_name(t) for t in vset.install} | {"rl-testing"})
    for package in ours:  # with --no-sources: pip sees what a release would publish
        release.run(["uv", "build", "--quiet", "--package", package, "--no-sources", "--wheel",
                     "--out-dir", str(house)])  # fmt: skip
    pins = [f"{p}=={release.version_of(p)}" for p in ours if p != "rl-testing"]
    if vset.vllm_pins:
        pins += [f"{n}=={v}" for n, v in compat.vllm_pins().items()]
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    extras = compat.testing_extras(vset.tests)
    testing = f"rl-testing[{','.join(extras)}]" if extras else "rl-testing"
    python = release.make_venv(work / "venv")
    release.install(
        python,
        ["--resolution", vset.resolution, "--constraints", str(constraints), *vset.install,
         testing, *compat.direct_requirements(vset), *compat.test_requirements(vset.tests)],
        find_links=house,
    )  # fmt: skip
    listing = release.run(["uv", "pip", "freeze", "--python", str(python)], capture=True)
    (work / "versions.txt").write_text(listing)
    session.log(f"compat({name}): installed\n{listing}")
    if vset.resolution == "lowest-direct":
        problems = compat.unreachable_floors(vset, release.installed(python))
        if problems:
            session.error("\n".join(problems))
    env = {**OFFLINE, "VIRTUAL_ENV": str(python.parent.parent)}
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        env |= {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(PYCACHE / name)}
    dirs = [f"packages/{p}/tests" for p in vset.tests]
    # The lock's Hypothesis derandomises under CI by itself (its ``ci`` profile); the floor's
    # does not, so the examples are pinned here: the versions are what these runs vary.
    session.run(
        str(python), "-m", "pytest", *dirs, "-m", "not slow", "-p", "no:cacheprovider", *XDIST,
        "--hypothesis-seed=0", *session.posargs, env=env, external=True,
    )  # fmt: skip
    if vset.extra_tests:  # whole files, slow ones included (the DeepSpeed launches)
        session.run(
            str(python), "-m", "pytest", *vset.extra_tests, "-p", "no:cacheprovider",
            *XDIST_BY_TEST, *session.posargs, env=env, external=True,
        )  # fmt: skip


@nox.session(name="compat-light")
def compat_light(session: nox.Session) -> None:
    """rl-advantages, rl-losses, rl-kernels at their floors (``compat(versions='floor-light')``)."""
    _compat(session, "floor-light")


@nox.session(name="compat", default=False)
@nox.parametrize("versions", list(compat.SETS))
def compat_session(session: nox.Session, versions: str) -> None:
    """Each package's unit tests at both ends of its ranges (docs/versions.md; not default).

    ``floor-light`` and ``floor``: every direct dependency at the lowest version its range
    admits; ``vllm``: torch, transformers and numpy as the locked vLLM pins them, the rest newest.
    The GitHub workflow ``compat.yml`` runs them weekly and on a change to a pyproject or the lock.
    """
    _compat(session, versions)


@nox.session
def integration(session: nox.Session) -> None:
    sync(session, "--all-packages", "--extra", "deepspeed", "--group", "test")
    session.run("pytest", "tests_integration", "-m", "not slow", *XDIST_BY_TEST, *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    # the tools group: tools/tests' release dry run (release.yml's steps, without the publish)
    sync(session, "--all-packages", "--extra", "deepspeed", "--group", "test", "--group", "tools")
    dirs = [f"packages/{p}/tests" for p in PACKAGES]
    session.run(
        "pytest", *dirs, "tools/rl-testing/tests", "tools/tests", "tests_integration", "-m", "slow",
        *XDIST_BY_TEST, *session.posargs,
        success_codes=[0, 5],  # 5: nothing is marked slow yet
    )  # fmt: skip


#: ``nox -s capabilities``: PyTorch's CPU kernels follow ``ATEN_CPU_CAPABILITY`` (a CPU without
#: the named instructions falls back to the widest it has) and MKL follows
#: ``MKL_ENABLE_INSTRUCTIONS``; each entry is one run of the suite (docs/testing.md).
CAPABILITIES = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default"},
}


@nox.session(default=False)
@nox.parametrize("capability", list(CAPABILITIES))
def capabilities(session: nox.Session, capability: str) -> None:
    """Every package's unit tests, integration and slow, with the CPU kernels of a narrower CPU.

    ``nox -s "capabilities(capability='default')"`` runs one; arguments after ``--`` go to
    pytest (e.g. ``-m 'not slow'``). The suite must pass under each: tolerances come from
    ``rl_testing.tolerance``, not from one machine's rounding.
    """
    sync(session, "--all-packages", "--extra", "deepspeed", "--group", "test", "--group", "tools")
    # inductor's on-disk cache does not key on ATEN_CPU_CAPABILITY: a kernel compiled under
    # another capability on this machine came back and computed the wrong chunk body (the
    # slow test_compile, 7% off); each capability compiles into its own cache
    inductor = Path(session.create_tmp()).resolve() / "inductor-cache"
    env = {**CAPABILITIES[capability], "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    session.run(
        "python", "-c",
        "import torch; print('CPU capability in use:', torch.backends.cpu.get_cpu_capability())",
        env=env,
    )  # fmt: skip
    dirs = [f"packages/{p}/tests" for p in PACKAGES]
    session.run(
        "pytest", *dirs, "tools/rl-testing/tests", "tests_integration", *session.posargs, env=env
    )


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    # the interpreter that runs nox, nothing installed: on a GPU machine without network its own
    # torch stack, the workspace from source (tools/gpu/run.py); without CUDA the CUDA cases skip
    # with their reason and the benchmark runs its CPU smoke
    session.run(sys.executable, "tools/gpu/run.py", *session.posargs, external=True)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    # the liger extra lets the kernel benchmark compare against Liger's chunked loss
    sync(session, "--all-packages", "--extra", "liger", "--group", "test")
    session.run("python", "tools/bench/run.py", *session.posargs)


@nox.session(name="bench-peers", default=False)
def bench_peers(session: nox.Session) -> None:
    # ours runs in this env; TRL and AgileRL run in throwaway venvs outside the workspace
    # (~/.cache/rl-bench-peers by default), never installed here
    sync(session, "--all-packages")
    session.run("python", "tools/bench/bench_peers.py", *session.posargs)


@nox.session(default=False)
def conformance(session: nox.Session) -> None:
    # the peers live in their own venvs outside the workspace; this env only needs ours + torch
    sync(session, "--all-packages")
    session.run("python", "tools/conformance/run.py", *session.posargs)


#: The tinker-cookbook release the recipe check installs (0.6.1 needs tml-renderers>=0.4.1, not
#: on the registry; 0.5.8 pins transformers<=5.5.4, so it gets a venv of its own).
TINKER_COOKBOOK = "tinker-cookbook[math-rl]==0.5.8"


@nox.session(name="tinker-cookbook", default=False)
def tinker_cookbook(session: nox.Session) -> None:
    # the server from the workspace (rl-train[tinker]), the recipe from its own venv: HTTP only
    sync(session, "--package", "rl-train", "--extra", "tinker")
    work = Path(session.create_tmp()).resolve() / "tinker-cookbook"
    cookbook = release.make_venv(work / "venv")
    release.install(cookbook, [TINKER_COOKBOOK])
    server = Path(session.virtualenv.location) / "bin" / "python"
    session.run(
        "python", "tools/tinker_cookbook_check.py", "--server-python", str(server),
        "--cookbook-python", str(cookbook), "--work", str(work / "run"),
    )  # fmt: skip


@nox.session
def docs(session: nox.Session) -> None:
    sync(session, "--all-packages", "--group", "docs")
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs,
        env={"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@nox.session(name="docs-browser")
def docs_browser(session: nox.Session) -> None:
    # the system's Chromium, as tools/docs/browser_check.py finds it
    browser = (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if browser is None:
        session.skip(
            "no Chromium on this machine (apt-get install chromium, as .ci/run does as root); "
            "the docs site was not opened in a browser"
        )
    sync(session, "--all-packages", "--group", "docs", "--group", "docs-browser")
    # the checker's own tests: a broken formula, a missing MathJax, a broken link must fail
    session.run("pytest", "tools/docs", "-p", "no:cacheprovider", env={"CHROMIUM": browser})
    out = Path(session.virtualenv.location)
    site = out / "site"
    session.run(
        "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site),
        env={"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    session.run(
        "python", "tools/docs/browser_check.py", str(site),
        "--screenshots", str(out / "screenshots"), "--browser", browser, *session.posargs,
    )  # fmt: skip


@nox.session
def tools(session: nox.Session) -> None:
    """tools/tests: affected.py on scratch git repos, workflow schemas, release check-tag."""
    sync(session, "--only-group", "tools")
    session.run("pytest", "tools/tests", *(session.posargs or ["-m", "not slow"]))


@nox.session(name="affected", default=False, venv_backend="none")
def affected_sessions(session: nox.Session) -> None:
    """Run exactly the sessions a change needs: ``nox -s affected -- origin/main...HEAD``.

    The arguments are tools/affected.py's: a git range, ``--files PATH ...`` or ``--all``.
    """
    try:
        plan = affected.plan(affected.paths_from_args(session.posargs))
    except affected.AffectedError as exc:
        session.error(f"nox -s affected -- ...: {str(exc).rstrip('.')}")  # nox adds a period
    for reason in plan.reasons:
        session.log(reason)
    if not plan.sessions:
        session.log("nothing to run")
    for name in plan.sessions:
        session.log(f"queued: {name} {' '.join(plan.posargs.get(name, []))}")
        # the posargs of this session (the range) must not reach pytest in the queued ones
        session.notify(name, posargs=plan.posargs.get(name, []))


def _build_session(package: str) -> None:
    @nox.session(name=f"build-{package}", default=False, venv_backend="none", tags=["build"])
    def build(session: nox.Session) -> None:
        wheel, sdist = release.build(package)
        release.smoke(package)
        session.log(f"built and installed in fresh venvs: {wheel.name}, {sdist.name}")


for _pkg in PACKAGES:
    _build_session(_pkg)
