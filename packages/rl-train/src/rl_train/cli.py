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
import contextlib
import difflib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path

from rl_algos.names import ALGORITHMS
from rl_envs.remote_reward import RewardServerError, add_server_arguments, load_reward, serve
from rl_envs.tasks import available_tasks

from rl_train.config import RunConfig, load_config
from rl_train.demo import DemoConfig, claim_run_dir
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
    demo.add_argument(
        "--task",
        default=defaults.task,
        help="built-in task (rl_envs.tasks; default: %(default)s)",
    )
    demo.add_argument(
        "--algo", default=defaults.algo, choices=ALGORITHMS, help="default: %(default)s"
    )
    demo.add_argument(
        "--steps", type=int, default=defaults.steps, help="training steps (default: %(default)s)"
    )
    demo.add_argument("--seed", type=int, default=defaults.seed, help="default: %(default)s")
    demo.add_argument(
        "--run-dir",
        default="runs/demo",
        help="where the run is written; a previous demo run there is replaced "
        "(default: %(default)s)",
    )
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
        description="Greedy accuracy of a checkpoint on the data of a config (with an env: "
        "section: the greedy mean return of env.eval_episodes fresh episodes).",
    )
    ev.add_argument(
        "checkpoint",
        help="a checkpoint (a step_* directory), or a run directory or its checkpoints/ folder "
        "(their latest checkpoint)",
    )
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
    for command in sub.choices.values():  # errors after parsing use the command's usage
        command.set_defaults(command_parser=command)
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
    settings = {"task": args.task, "algo": args.algo, "steps": args.steps, "seed": args.seed}
    if claim_run_dir(args.run_dir, settings):
        print(f"rl-train demo: replacing the previous demo run in {args.run_dir}")
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


def _load(path: str | None, overrides: list[str]) -> RunConfig:
    """:func:`load_config`, its warnings (a setting the algorithm ignores) one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(path, overrides)
    for warning in caught:
        print(f"rl-train: warning: {warning.message}", file=sys.stderr)
    return config


def _run(args: argparse.Namespace) -> int:
    """``rl-train run CONFIG [overrides]``."""
    config = args.run_config = _load(args.config, args.overrides)  # before torch: at once
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
    config = args.run_config = _load(args.config, args.overrides)
    from rl_train.run import evaluate

    result = evaluate(config, args.checkpoint)
    if "mean_return" in result:  # an env: section's episodes
        print(f"greedy mean return: {result['mean_return']:.3f}")
    else:
        accuracy, reward = result["accuracy"], result["test_reward"]
        print(f"greedy accuracy: {accuracy:.2f}   test reward: {reward:.3f}")
    return 0


def _reward_server(args: argparse.Namespace) -> int:
    """``rl-train reward-server --reward NAME [--import MODULE] [--host H] [--port P]``."""
    if args.imports or ":" not in args.reward:  # the built-in rewards and imports: torch
        from rl_train.builder import build_reward, import_user_code

        import_user_code(args.imports)
        fn = build_reward(args.reward, key="--reward")
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


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``: ``key=value`` overrides anywhere after ``run`` / ``eval``'s positionals
    (before or after flags), errors with the sub-command's usage and a close option name.
    """  # noqa: D205
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    if getattr(args, "overrides", None) is not None:
        args.overrides += [a for a in extra if not a.startswith("-")]
        extra = [a for a in extra if a.startswith("-")]
    if extra:
        sub = getattr(args, "command_parser", parser)
        message = f"unrecognized arguments: {' '.join(extra)}"
        options = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
        for arg in extra:
            close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1)
            if arg.startswith("--") and close:
                message += f"; did you mean {close[0]}?"
                break
        sub.error(message)
    return args


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While training, SIGTERM stops the run as Ctrl-C does: through its cleanup (the rollout
    worker stopped, TensorBoard and the trackers closed), not at once.

    Only in a single process's main thread: under a launcher (``torchrun``, ``accelerate
    launch``) the launcher's own SIGTERM handling applies.
    """  # noqa: D205

    def interrupt(signum: int, frame: object) -> None:
        del frame
        raise KeyboardInterrupt(signal.Signals(signum).name)

    alone = os.environ.get("WORLD_SIZE", "1") == "1"
    if not alone or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped(args: argparse.Namespace, exc: KeyboardInterrupt) -> int:
    """Say where a run stopped by Ctrl-C or SIGTERM continues from; 128 + the signal."""
    from rl_train.checkpoint import checkpoint_step, latest_checkpoint

    name = str(exc) if str(exc) == "SIGTERM" else "SIGINT"
    config = getattr(args, "run_config", None)
    run_dir = config.train.run_dir if config is not None else getattr(args, "run_dir", None)
    where = ""
    if run_dir is not None:  # None: stopped while the config was read
        latest = latest_checkpoint(run_dir)
        where = f"; no checkpoint in {Path(run_dir) / 'checkpoints'}"
        if latest is not None:
            where = f"; the last checkpoint is step {checkpoint_step(latest)} in {latest.parent}"
            where += ": continue with train.resume=true" if args.command == "run" else ""
    print(f"rl-train: stopped by {name}{where}", file=sys.stderr)
    return 128 + int(signal.Signals[name])


def _rollout_server_error(exc: BaseException) -> BaseException | None:
    """``exc`` or its cause when it is rl-rollout's ``RolloutServerError`` (not imported here:
    it is loaded once a run talks to a rollout server).
    """  # noqa: D205
    cls: type[BaseException] | None = getattr(
        sys.modules.get("rl_rollout.server"), "RolloutServerError", None
    )
    for error in (exc, exc.__cause__):
        if cls is not None and isinstance(error, cls):
            return error
    return None


def _key_of_path(args: argparse.Namespace, filename: object) -> str:
    """``train.run_dir: `` / ``--run-dir: `` when ``filename`` is in the run directory."""
    config = getattr(args, "run_config", None)
    run_dir, key = getattr(args, "run_dir", None), "--run-dir"
    if config is not None:
        run_dir, key = config.train.run_dir, "train.run_dir"
    if filename is None or run_dir is None:
        return ""
    path, run = Path(os.fsdecode(filename)).resolve(), Path(run_dir).resolve()  # type: ignore[arg-type]
    return f"{key}: " if path == run or run in path.parents else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rl-train`` command and return its exit status.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The process exit status (2: bad arguments or configuration, or no command; 130 / 143:
        ``run`` or ``demo`` stopped by Ctrl-C / SIGTERM, saying where to resume from).
    """
    parser = build_parser()
    args = _parse(parser, argv)
    commands = {"demo": _demo, "run": _run, "eval": _eval, "reward-server": _reward_server}
    commands["tinker-server"] = _tinker_server
    if args.command not in commands:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    training = args.command in ("run", "demo")
    try:
        with _sigterm_interrupts() if training else contextlib.nullcontext():
            return commands[args.command](args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM while training
        if args.debug or not training or getattr(args, "print_config", False):
            raise
        return _stopped(args, exc)
    except (ValueError, FileNotFoundError) as exc:
        if args.debug:
            raise
        print(f"rl-train: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, FloatingPointError) as exc:  # a run directory on a file, a diverged run
        if args.debug:
            raise
        where = _key_of_path(args, exc.filename) if isinstance(exc, OSError) else ""
        print(f"rl-train: {where}{exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a reward or rollout server down or silent: its message, one line
        server_error = exc if isinstance(exc, RewardServerError) else exc.__cause__
        rollout_error = _rollout_server_error(exc)
        if args.debug or not (isinstance(server_error, RewardServerError) or rollout_error):
            raise
        if rollout_error is not None:
            config = getattr(args, "run_config", None)
            asynchronous = config is not None and config.async_ is not None
            key = "async.engine_url" if asynchronous else "engine_url"
            message = str(rollout_error).replace("`base_url`", f"`{key}`")
            print(f"rl-train: {key}: {message}", file=sys.stderr)
        else:
            print(f"rl-train: {server_error}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
