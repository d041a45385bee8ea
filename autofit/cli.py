"""The `autofit` command line: `autofit <command> [key=value ...]`.

This is the one place that turns an `AutofitError` into a one-line message and an exit code. It
imports nothing heavy: each command's module (and torch, through it) loads only when run.
"""

from __future__ import annotations

import importlib
import logging
import sys

from autofit import __version__
from autofit.errors import AutofitError, ConfigError

COMMANDS = {
    "search": "find the largest and fastest run that fits a GPU (every probe in an Optuna study)",
    "probe": "measure one training configuration against a GPU",
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
    from autofit.knobs import registry
    from autofit.paths import conf_dir, group_options

    lines = [f"usage: autofit {command} [key=value ...]", "", COMMANDS[command], "", "choices:"]
    for group in ("model", "gpu"):
        lines.append(f"  {group:<14} {' | '.join(group_options(group))}")
    lines += ["", "knobs:"]
    for knob in registry().values():
        default = "model's native" if knob.default is None else str(knob.default).lower()
        lines.append(f"  {knob.name:<14} {knob.describe()} (default {default}): {knob.help}")
    lines += ["", f"other settings and their defaults: {conf_dir() / (command + '.yaml')}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
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
            raise ConfigError(f"unknown command '{command}'; valid commands: {', '.join(COMMANDS)}")
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
    except KeyboardInterrupt:
        print("autofit: interrupted", file=sys.stderr)
        return 130
