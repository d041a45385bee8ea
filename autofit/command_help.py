"""`autofit <command> --help`: a command's settings as its conf/<command>.yaml documents them."""

from __future__ import annotations

import re

from autofit.config import command_groups
from autofit.export import TARGETS
from autofit.knobs import registry
from autofit.paths import conf_dir, group_options, search_spaces_dir, yaml_names


def command_help(command: str, summary: str) -> str:
    """The command's settings as its conf/<command>.yaml documents them, the model and GPU
    choices where it takes them, and the knobs (probe) or search spaces (search); `summary`:
    the line the CLI's usage gives the command."""
    text = (conf_dir() / f"{command}.yaml").read_text()
    lines = [
        f"usage: autofit {command} [key=value ...]",
        f"       autofit {command} -m key=a,b ...   (a sweep: one run per combination of values)",
        "", summary, "", "settings:",
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
        lines += ["", "knobs:"]
        for knob in registry().values():
            default = "model's native" if knob.default is None else str(knob.default).lower()
            lines.append(f"  {knob.name:<22} {knob.describe()} (default {default}): {knob.help}")
    if command == "export":
        lines += ["", "targets:"] + [f"  {n:<22} {t.summary}" for n, t in TARGETS.items()]
    if command == "search":
        spaces = yaml_names(search_spaces_dir())
        lines += ["", f"spaces: {', '.join(spaces)} (search_spaces/), or a path to a .yaml file"]
        lines += [f"trainers (trainer=): {', '.join(TARGETS)}"]
    return "\n".join(lines)
