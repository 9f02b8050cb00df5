"""The ``rl-train`` command line.

``rl-train demo`` runs a real training job on the embedded default (a tiny model built from
scratch and a built-in task, on CPU) and reports greedy accuracy before and after, and where
the run directory is (checkpoints, metrics, reward curve).

Start-up is cheap on purpose: the arguments and the YAML (types, unknown keys, missing files,
algorithm names) are checked before torch or any model library is imported; ``rl_train.run``
(torch, transformers, the agents) is imported only by the command that trains or evaluates.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import version

from rl_algos.names import ALGORITHMS
from rl_envs.remote_reward import RewardServerError, add_server_arguments, load_reward, serve
from rl_envs.tasks import available_tasks

from rl_train.config import load_config
from rl_train.demo import DemoConfig
from rl_train.tinker.command import add_arguments as tinker_arguments

#: Exit status for bad arguments or configuration.
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``rl-train`` command.

    Returns:
        The parser (sub-commands ``demo``, ``run``, ``eval``, ``reward-server``).
    """
    parser = argparse.ArgumentParser(
        prog="rl-train",
        description="Reinforcement-learning fine-tuning of causal language models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('rl-train')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="train the embedded tiny model on the embedded task, on CPU",
        description="Train the embedded tiny model on the embedded task, on CPU.",
    )
    defaults = DemoConfig()
    demo.add_argument("--task", default=defaults.task, help="built-in task (rl_envs.tasks)")
    demo.add_argument("--algo", default=defaults.algo, choices=ALGORITHMS)
    demo.add_argument("--steps", type=int, default=defaults.steps)
    demo.add_argument("--seed", type=int, default=defaults.seed)
    demo.add_argument("--run-dir", default="runs/demo", help="where the run is written")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.add_argument("--debug", action="store_true", help="show tracebacks")
    run = sub.add_parser(
        "run",
        help="train from a YAML config",
        description="Train from a YAML config; `key.sub=value` arguments override it.",
    )
    run.add_argument("config", help="YAML file (see examples/)")
    run.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--debug", action="store_true", help="show tracebacks")
    run.add_argument(
        "--print-config",
        action="store_true",
        help="print every resolved setting and where it comes from (default, agent default, "
        "preset, tiny model, run, YAML, command line), then exit",
    )
    ev = sub.add_parser(
        "eval",
        help="evaluate a checkpoint",
        description="Greedy accuracy of a checkpoint on the data of a config.",
    )
    ev.add_argument("checkpoint", help="a checkpoint directory (or a step_* directory)")
    ev.add_argument("--config", default=None, help="the run's YAML (default: built-in demo)")
    ev.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    ev.add_argument("--debug", action="store_true", help="show tracebacks")
    rs = sub.add_parser(
        "reward-server",
        help="serve a reward function over HTTP (data.reward_url)",
        description="Serve a reward function over HTTP for runs with data.reward_url (e.g. a "
        "reward model on another machine): demo, exact_match, tagged or module:function "
        "(per sample, (completion, answer, question) -> float, or TRL-style batched).",
    )
    add_server_arguments(rs)
    rs.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="a module or .py file to import first (repeatable), as the config's imports",
    )
    rs.add_argument("--debug", action="store_true", help="show tracebacks")
    ts = sub.add_parser(
        "tinker-server",
        help="serve the Tinker API (the tinker SDK) on a local model",
        description="Serve the Tinker REST API of the official `tinker` SDK on loopback: LoRA "
        "training clients, Tinker's losses (rl-losses), sampling and checkpoints "
        "(needs rl-train[tinker]).",
    )
    tinker_arguments(ts)
    return parser


def _demo(args: argparse.Namespace) -> int:
    """``rl-train demo``: the preset run on the tiny model (ILQL: its offline demo)."""
    if args.task not in available_tasks():
        print(
            f"rl-train: unknown task {args.task!r}; choose one of {', '.join(available_tasks())}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.steps < 1:
        print(f"rl-train: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return EXIT_USAGE
    import torch  # heavy: only once the arguments are known to be good

    # One intra-op thread: the ~78k-parameter model's matrices are too small to gain from
    # more, and spinning worker threads cost the most on a shared 2-core machine.
    torch.set_num_threads(1)
    if args.algo == "ilql":  # offline: log a behaviour dataset, then learn from it alone
        from rl_train.ilql_demo import ILQLDemoConfig, run_ilql_demo

        ilql = ILQLDemoConfig(task=args.task, steps=args.steps, seed=args.seed)
        run_ilql_demo(ilql, args.run_dir, progress=not args.quiet)
        return 0
    from rl_train.run import fit, prepare

    demo = DemoConfig(task=args.task, algo=args.algo, steps=args.steps, seed=args.seed)
    built = prepare(demo.run_config(args.run_dir))
    n_params = sum(p.numel() for p in built.model.parameters())
    print(
        f"rl-train demo: {demo.algo} on {demo.task}, a {n_params:,}-parameter model "
        f"built from scratch, {demo.steps} steps on CPU"
    )
    summary = fit(built, verbose=not args.quiet, say=print)
    print(f"run directory: {summary.run_dir}")
    print("  checkpoints/   metrics.csv   metrics.jsonl   tensorboard/   reward_curve.png")
    return 0


def _run(args: argparse.Namespace) -> int:
    """``rl-train run CONFIG [overrides]``."""
    config = load_config(args.config, args.overrides)  # before torch: errors answer at once
    if args.print_config:
        _print_config(config, args)
        return 0
    from rl_train.run import train

    summary = train(config, verbose=not args.quiet, say=print)
    if summary.main_process:
        print(f"run directory: {summary.run_dir}")
    _end_process_group()
    return 0


def _end_process_group() -> None:
    """Destroy a launcher's process group (``torchrun``, ``accelerate launch``) once the run is
    over, on every rank.

    Left to interpreter shutdown, a gloo group can abort a process after everything is written
    ("terminate called without an active exception", SIGABRT), which the launcher then reports
    as a failed run.
    """  # noqa: D205
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _print_config(config: object, args: argparse.Namespace) -> None:
    """``rl-train run --print-config``: one ``key = value  # source`` line per setting."""
    from rl_train.settings import resolved_settings, yaml_keys

    command_line = {item.split("=", 1)[0].strip() for item in args.overrides}
    settings = resolved_settings(config, yaml_keys(args.config), command_line)  # type: ignore[arg-type]
    width = max(len(f"{s.key} = {s.value!r}") for s in settings)
    for s in settings:
        print(f"{f'{s.key} = {s.value!r}':<{width}}  # {s.source}")


def _eval(args: argparse.Namespace) -> int:
    """``rl-train eval CHECKPOINT [--config CONFIG] [overrides]``."""
    config = load_config(args.config, args.overrides)
    from rl_train.run import evaluate

    result = evaluate(config, args.checkpoint)
    print(f"greedy accuracy: {result['accuracy']:.2f}   test reward: {result['test_reward']:.3f}")
    return 0


def _reward_server(args: argparse.Namespace) -> int:
    """``rl-train reward-server --reward NAME [--import MODULE] [--host H] [--port P]``."""
    if args.imports or ":" not in args.reward:  # the built-in rewards and imports: torch
        from rl_train.builder import build_reward, import_user_code

        import_user_code(args.imports)
        fn = build_reward(args.reward)
    else:  # module:function from the working directory, without torch
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        fn = load_reward(args.reward)
    serve(fn, args.host, args.port)
    return 0


def _tinker_server(args: argparse.Namespace) -> int:
    """``rl-train tinker-server --model DIR --api-key tml-...`` (rl_train.tinker)."""
    from rl_train.tinker.command import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rl-train`` command and return its exit status.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The process exit status.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    commands = {"demo": _demo, "run": _run, "eval": _eval, "reward-server": _reward_server}
    commands["tinker-server"] = _tinker_server
    if args.command in commands:
        try:
            return commands[args.command](args)
        except (ValueError, FileNotFoundError) as exc:
            if args.debug:
                raise
            print(f"rl-train: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except Exception as exc:  # a reward server down or silent: its message, one line
            server_error = exc if isinstance(exc, RewardServerError) else exc.__cause__
            if args.debug or not isinstance(server_error, RewardServerError):
                raise
            print(f"rl-train: {server_error}", file=sys.stderr)
            return 1
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
