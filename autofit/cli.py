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

USAGE = """usage: autofit <command> [key=value ...]

Find the largest and fastest training run that fits in a GPU's memory.

commands:
{commands}

Settings are Hydra overrides, e.g.
  autofit search model=sana_1600m gpu=a40
  autofit probe model=sana_1600m gpu=a40 batch_size=2 precision=bf16 checkpointing=true
  autofit search -m model=sana_1600m,tiny_sana gpu=a40,l40s     # a sweep, one search each

`autofit <command> --help` lists a command's settings and knobs."""


def _usage() -> str:
    width = max(map(len, COMMANDS))
    return USAGE.format(commands="\n".join(f"  {n:<{width}}  {h}" for n, h in COMMANDS.items()))


def _command_help(command: str) -> str:
    """The command's settings as its conf/<command>.yaml documents them, the model and GPU
    choices where it takes them, and the knobs (probe) or search spaces (search)."""
    import re

    from autofit.config import command_groups
    from autofit.paths import conf_dir, group_options, search_spaces_dir, yaml_names

    text = (conf_dir() / f"{command}.yaml").read_text()
    lines = [
        f"usage: autofit {command} [key=value ...]",
        f"       autofit {command} -m key=a,b ...   (a sweep: one run per combination of values)",
        "", COMMANDS[command], "", "settings:",
    ]  # fmt: skip
    parent = ""
    setting = re.compile(r"( {0,2})(\w+):[ \t]*([^#\n]*?)[ \t]*(?:#[ \t]*(.*))?")
    continued = re.compile(r"[ \t]+#[ \t]*(.*)")  # a comment's next line, indented under it
    settings: list[list[str]] = []  # name, default, comment
    last = None  # the setting a continued comment belongs to
    for line in text.splitlines():
        more = continued.fullmatch(line)
        if more and last is not None:
            last[2] = f"{last[2]} {more.group(1)}".strip()
            continue
        match, last = setting.fullmatch(line), None
        if match is None:
            continue
        indent, key, default, comment = match.groups()
        if not indent:
            parent = key if not default else ""
        if key == "defaults" or (not indent and not default and not comment):
            continue  # the defaults list, or a section whose keys follow (target.resolution)
        if indent and not parent:
            continue
        last = [f"{parent}.{key}" if indent else key, default or "", comment or ""]
        settings.append(last)
    lines += [
        f"  {name:<22} {default:<10} {comment}".rstrip() for name, default, comment in settings
    ]
    for group in command_groups(command):
        own = " | path/to/card.yaml (docs/gpus.md)" if group == "gpu" else ""
        lines.append(f"  {group:<22} {' | '.join(group_options(group))}{own}")
    if command == "probe":
        from autofit.knobs import registry

        lines += ["", "knobs:"]
        for knob in registry().values():
            default = "model's native" if knob.default is None else str(knob.default).lower()
            lines.append(f"  {knob.name:<22} {knob.describe()} (default {default}): {knob.help}")
    if command == "export":
        from autofit.export import TARGETS

        lines += ["", "targets:"] + [f"  {n:<22} {t.summary}" for n, t in TARGETS.items()]
    if command == "search":
        from autofit.export import TARGETS

        spaces = yaml_names(search_spaces_dir())
        lines += ["", f"spaces: {', '.join(spaces)} (search_spaces/), or a path to a .yaml file"]
        lines += [f"trainers (trainer=): {', '.join(TARGETS)}"]
    return "\n".join(lines)


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
            print(_command_help(command))
            return 0
        module = importlib.import_module(f"autofit.commands.{command}")
        if rest and rest[0] in ("-m", "--multirun"):
            from autofit.commands.sweep import sweep

            return sweep(command, rest[1:], module.run_config)
        return int(module.run(rest))
    except AutofitError as exc:
        print(f"autofit: error: {exc}", file=sys.stderr)
        return exc.exit_code
