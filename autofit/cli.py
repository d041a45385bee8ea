"""The `autofit` command line: `autofit <command> [key=value ...]`.

This is the one place that turns an `AutofitError` into a one-line message and an exit code. It
imports nothing heavy: each command's module (and torch, through it) loads only when run.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from autofit import __version__
from autofit.errors import AutofitError, ConfigError, Interrupted, suggest

COMMANDS = {
    "search": "find the largest and fastest run that fits a GPU (every probe in an Optuna study)",
    "probe": "measure one training configuration against a GPU",
    "report": "a study's Pareto front, memory breakdown and charts; compare=<study> for regressions",
    "export": "write a study's best run (or point=N, the Nth Pareto row from 1) in a trainer's files (target=<trainer>)",
    "models": "list the model presets with their parameter counts",
    "calibrate": "run a calibration set simulated and on the local GPU; the simulator's error against it",
}

# The commands whose overrides' names (models, GPUs, settings' groups) are checked before the
# command loads, so that a misspelt name is answered without loading its wiring; `probe` loads
# first, as it starts its fork server before anything else (torch imports while Hydra composes).
NAMES_FIRST = frozenset(COMMANDS) - {"probe"}

USAGE = """usage: autofit <command> [key=value ...]

Find the largest and fastest training run that fits in a GPU's memory.

commands:
{commands}

Settings are Hydra overrides, e.g.
  autofit search model=sana_1600m gpu=a40
  autofit probe model=sana_1600m gpu=a40 batch_size=2 precision=bf16 checkpointing=true
  autofit search -m model=sana_1600m,tiny_sana gpu=a40,l40s     # a sweep, one search each

`autofit <command> --help` lists a command's settings and knobs."""


def _load(module: str) -> Any:
    """autofit.<module>, loaded when the CLI dispatches to it: the one deliberate lazy import,
    so that nothing of a command (nor torch, through it) loads before it runs."""
    return importlib.import_module(f"autofit.{module}")


def _usage() -> str:
    width = max(map(len, COMMANDS))
    return USAGE.format(commands="\n".join(f"  {n:<{width}}  {h}" for n, h in COMMANDS.items()))


# What a terminal (Ctrl-C), a scheduler (SIGTERM before SIGKILL) or a closed session sends.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While a command runs, the first stop signal raises `Interrupted` in the main thread, so
    that the command unwinds (a search kills its probes on the way out: autofit/probe/launcher.py)
    and the CLI says so in one line; later ones are ignored, so that nothing cuts that unwinding
    short. A signal set to be ignored when autofit started (nohup, `&` in a script) stays
    ignored. The previous handlers come back after (tests run the CLI in their own process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            raise Interrupted(signum)

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, before in previous.items():
        if before is not signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def main(argv: list[str] | None = None) -> int:
    try:
        with _stopped_by_signals():
            return _main(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:  # `autofit --help | head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:
        code = _interrupted(exc)
        if argv is None:
            # The program itself (not a caller's `main([...])`): end now. Every probe is ended
            # and each finished one was committed to the study as it finished; the interpreter's
            # own teardown, with torch loaded, takes seconds, past the 2 a stop signal gets.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code


def _interrupted(exc: KeyboardInterrupt) -> int:
    if not isinstance(exc, Interrupted):  # a KeyboardInterrupt raised by other means
        print("autofit: interrupted", file=sys.stderr)
        return 130
    note = f"; {exc.note}" if exc.note else ""
    print(f"autofit: interrupted by {exc.signal_name}{note}", file=sys.stderr)
    return exc.exit_code


def _main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        print(f"autofit {__version__}")
        return 0
    command, rest = args[0], args[1:]
    logging.basicConfig(level=logging.WARNING, format="autofit: %(message)s")
    try:
        if command not in COMMANDS:
            raise ConfigError(
                f"unknown command '{command}'{suggest(command, list(COMMANDS))}; valid commands: "
                f"{', '.join(COMMANDS)}"
            )
        if any(a in ("-h", "--help") for a in rest):
            print(_load("command_help").command_help(command, COMMANDS[command]))
            return 0
        sweep = bool(rest) and rest[0] in ("-m", "--multirun")
        if command in NAMES_FIRST and not sweep:
            _load("config").check_names(command, rest)
        module = _load(f"commands.{command}")
        if sweep:
            return _load("commands.sweep").sweep(command, rest[1:], module.run_config)
        return int(module.run(rest))
    except AutofitError as exc:
        print(f"autofit: error: {exc}", file=sys.stderr)
        return exc.exit_code
