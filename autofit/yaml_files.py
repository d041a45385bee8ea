"""Reading a YAML file a user may have written or edited: a search space, a GPU card, a preset or
a companion in conf/, a calibration set. Every one is read by `read_yaml`.

An alias (`*name`) repeats its anchor's value without copying it, so a file of a few lines can
stand for billions of values (nine lists of nine aliases to the list before: 9**9). PyYAML builds
them as shared objects, cheaply; whatever then walks the value in full (OmegaConf when Hydra
composes a preset, an error message's repr, json, a deep copy) runs out of time or memory. So the
file's node graph is composed first and measured as if every alias were expanded, each node once
(its measure memoised: linear in the nodes the file holds, however far they expand), and a file
past the limits is refused in one line before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autofit.errors import ConfigError, yaml_error

# The largest YAML file autofit ships (autofit/export/trainer_defaults.yaml) holds 487 values, a
# preset at most 187 (a value: each scalar, list and mapping, keys included). Twenty times the
# largest is still one second of OmegaConf (about 70 us a value) when Hydra composes a preset.
MAX_VALUES = 10_000
# The deepest shipped file nests 7 levels (tiny_sana.yaml's companions); OmegaConf recurses past
# Python's default limit at about 110.
MAX_DEPTH = 32


def read_yaml(path: Path, source: object) -> Any:
    """The data in the YAML file at `path`, or a one-line ConfigError naming `source`: the file
    cannot be read, does not parse, or expands past MAX_VALUES values or MAX_DEPTH levels."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot be read: {exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise yaml_error(source, exc) from None
        except RecursionError:  # PyYAML's composer recurses once a level, about 1000 deep
            raise ConfigError(f"{source}: nests deeper than {MAX_DEPTH} levels") from None
        if node is None:  # an empty file
            return None
        values, depth = _expanded_size(node)
        if values > MAX_VALUES:
            raise ConfigError(
                f"{source}: expands past {MAX_VALUES} values once its aliases (*name) are "
                "repeated in full; autofit reads no YAML file that large"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: nests deeper than {MAX_DEPTH} levels")
        try:
            return loader.construct_document(node)
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: an int past Python's 4300
            raise yaml_error(source, exc) from None  # digits, a date such as 2024-02-30
    finally:
        loader.dispose()


def _expanded_size(root: Any) -> tuple[float, float]:
    """(values, depth) of a YAML node with every alias expanded: an aliased node counts each time
    it appears but is measured once. A node reached again inside itself (`&a [*a]`) expands
    without end: (inf, inf). Iterative, so that depth costs no Python recursion."""
    measured: dict[int, tuple[float, float]] = {}
    open_nodes: set[int] = set()  # entered, their children not all measured yet
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_measured = stack.pop()
        children = (
            [part for pair in node.value for part in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if children_measured:
            sizes = [measured[id(child)] for child in children]
            measured[id(node)] = (
                1 + sum(values for values, _ in sizes),
                1 + max((depth for _, depth in sizes), default=0),
            )
            open_nodes.discard(id(node))
        elif id(node) in open_nodes:
            return float("inf"), float("inf")
        elif id(node) not in measured:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    return measured[id(root)]
