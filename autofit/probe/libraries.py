"""The optional libraries a probe's fresh process leaves out because its run does not use them.

diffusers imports peft, transformers, bitsandbytes and torchao at its own import whenever they
are installed (for its LoRA loaders, hooks and quantizers), whether the run uses them or not: leaving
them out took a whole Sana 1600M probe from 6.5 s to 4.5 s on two cores
(benchmarks/probe_speed.py --against). A worker started fresh marks each one its probe does not
use as absent before anything imports it: `sys.modules[name] = None`, Python's own way to make an
import fail, which `importlib.util.find_spec` (the libraries' check for what is installed) reads as
not installed. diffusers then takes the code paths it takes where they are not installed, which
build and run the same model.

What a probe uses is declared, not guessed: the model family's workload (its `libraries`,
autofit/families/) and each knob's `libraries` for its value. A library left out and
imported anyway ends the probe as a crash that says so (`crash_message`), never as a quiet
difference. A process that has imported a library already (a fork server's child) keeps it; a
search's fork server leaves out, before its imports, what no run of its space uses
(`libraries_of`, autofit/probe/launcher.py `launcher_for`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from autofit.families import REGISTRY as FAMILIES
from autofit.knobs import REGISTRY
from autofit.records.probe import ProbeSpec

log = logging.getLogger("autofit.probe.libraries")

# Imported by diffusers whenever installed, each seconds' worth of imports on two cores.
OPTIONAL = ("peft", "bitsandbytes", "transformers", "torchao")
# What one of them imports at its own import, unconditionally: kept wherever it is.
REQUIRES = {"peft": ("transformers",)}


def used_libraries(spec: ProbeSpec) -> set[str] | None:
    """The optional libraries `spec`'s run may import; None where that is not known (a model
    family whose code is the user's own)."""
    family = spec.model.get("family", "")
    return libraries_of(family, {name: (value,) for name, value in spec.knobs.items()})


def libraries_of(family: str, values: Mapping[str, Iterable[Any]]) -> set[str] | None:
    """The optional libraries runs of the model family may import with any of these knob
    values (a knob not named at its default), as `used_libraries` says of one run: what a
    search's fork server needs for every run of its space. None where that is not known."""
    declared = FAMILIES[family].libraries if family in FAMILIES else None
    if declared is None:
        return None
    named = set(declared)
    for knob in REGISTRY.values():
        for value in values.get(knob.name, (knob.default,)):
            named.update(knob.libraries(value))
    used = {name.split(".")[0] for name in named} & set(OPTIONAL)
    for name in list(used):
        used.update(REQUIRES.get(name, ()))
    return used


def leave_out_unused(specs: Iterable[ProbeSpec]) -> tuple[str, ...]:
    """Mark as absent each optional library that none of `specs` uses and this process has not
    imported, and log them; the names left out, in `OPTIONAL`'s order."""
    used: set[str] = set()
    for spec in specs:
        libraries = used_libraries(spec)
        if libraries is None:
            return ()
        used |= libraries
    left_out = tuple(name for name in OPTIONAL if name not in used and name not in sys.modules)
    for name in left_out:
        sys.modules[name] = None  # type: ignore[assignment]
    if left_out:
        log.info("left out %s: the run does not use them", ", ".join(left_out))
    return left_out


def crash_message(exc: BaseException) -> str:
    """How a probe's crash reads: its exception, and where it is the import of a library this
    process left out, that the run uses a library its family and knobs do not declare (a bug of
    autofit's, not the user's)."""
    said = f"{type(exc).__name__}: {exc}"
    name = exc.name if isinstance(exc, ImportError) else None
    library = name.split(".")[0] if name else ""
    if library in OPTIONAL and library in sys.modules and sys.modules[library] is None:
        said += (
            f" (this probe's process left {library} out as its model family and knobs do not "
            f"use it, autofit/probe/libraries.py: declare it in the family's libraries "
            f"(autofit/families/) or the knob's libraries())"
        )
    return said
