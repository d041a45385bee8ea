"""`autofit export`: a study's best configuration (or a Pareto point) in a trainer's own files."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError
from autofit.export import load_point, readme, target, write_export
from autofit.results import SUMMARY, check_folder, locate
from autofit.settings import TEXT, built, group, integer, setting


@dataclasses.dataclass(frozen=True)
class TargetSettings:
    """`target.`: the trainer, and the batch an optimizer step is to make."""

    name: str | None = setting(None, TEXT.or_null())
    global_batch: int | None = setting(None, integer(1).or_null())


@dataclasses.dataclass(frozen=True)
class ExportSettings:
    """`autofit export`'s settings, each with its rule; conf/export.yaml gives the defaults and
    says what each means."""

    target: TargetSettings = group(TargetSettings)
    study: str | None = setting(None, TEXT.or_null())
    source: str | None = setting(None, TEXT.or_null(), key="from")  # `from` is Python's
    point: int | None = setting(None, integer(1).or_null())
    out: str | None = setting(None, TEXT.or_null())


def _target_alias(overrides: list[str]) -> list[str]:
    """`target=kohya` names the trainer, while `target.global_batch=N` sets a goal of the same
    node: the config holds the name as `target.name`, and the short spelling is rewritten."""
    return [
        "target.name=" + o.split("=", 1)[1] if o.split("=", 1)[0] in ("target", "+target") else o
        for o in overrides
    ]


def run(overrides: list[str]) -> int:
    return run_config(compose_config("export", _target_alias(overrides)))


def run_config(cfg: Any) -> int:
    """Export what a composed `export` config asks for; print the launch command."""
    return export(built(ExportSettings, cfg))


def export(settings: ExportSettings) -> int:
    """The study's point, in the trainer's files, and the command that launches it."""
    named = settings.target.name
    if named is not None:
        target(named)  # a bad name is told before any study is read
    found = locate(settings.study, settings.source, named="export")
    check_folder(found)  # the whole folder, as one write: a damaged one says to rerun its search
    source = found / SUMMARY
    point = load_point(source, settings.point, settings.target.global_batch)
    # A search for one trainer's runs (trainer=) exports to that trainer unless told otherwise.
    chosen = target(named or point.summary.get("trainer"))
    out = Path(settings.out) if settings.out else source.parent / "export" / chosen.name
    # Absolute: the files point at each other and the command runs from the trainer's folder.
    plan = chosen.run(point, out.resolve())
    try:
        write_export(plan)
    except AutofitError as exc:
        if settings.out:  # a folder the user chose: theirs to fix
            raise
        # A study read from a read-only place: what the files would say, and where to put them.
        print(readme(plan), end="")
        raise AutofitError(
            f"{exc}; nothing is written (README.txt is above): add out=DIR to write the export there"
        ) from None
    _render(point, chosen, plan)
    return 0


def _render(point: Any, chosen: Any, plan: Any) -> None:
    print(f"exported {point.label} of {point.study} for {chosen.name} to {plan.out}/")
    print("  files    " + ", ".join([*plan.files, "README.txt", "export.json"]))
    for warning in plan.warnings:
        print(f"  warning  {warning}")
    for note in plan.notes:
        print(f"  to do    {note}")
    print(f"\nlaunch:\n  {plan.command}")
