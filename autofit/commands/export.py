"""`autofit export`: a study's best configuration (or a Pareto point) in a trainer's own files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError


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
    from omegaconf import OmegaConf

    from autofit.export import load_point, readme, target, write_export
    from autofit.results import SUMMARY, check_folder, locate

    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    named = data["target"]["name"]
    if named is not None:
        target(named)  # a bad name is told before any study is read
    # Hydra reads `study=2024` as a number: every name and path is taken as text.
    name, folder = (None if data.get(k) is None else str(data[k]) for k in ("study", "from"))
    found = locate(name, folder, named="export")
    check_folder(found)  # the whole folder, as one write: a damaged one says to rerun its search
    source = found / SUMMARY
    point = load_point(source, data.get("point"), data["target"].get("global_batch"))
    # A search for one trainer's runs (trainer=) exports to that trainer unless told otherwise.
    chosen = target(named or point.summary.get("trainer"))
    out = Path(data["out"]) if data.get("out") else source.parent / "export" / chosen.name
    # Absolute: the files point at each other and the command runs from the trainer's folder.
    plan = chosen.run(point, out.resolve())
    try:
        write_export(plan)
    except AutofitError as exc:
        if data.get("out"):  # a folder the user chose: theirs to fix
            raise
        # A study read from a read-only place: what the files would say, and where to put them.
        print(readme(plan), end="")
        raise AutofitError(
            f"{exc}; nothing is written (README.txt is above): add out=DIR to write the export there"
        ) from None

    print(f"exported {point.label} of {point.study} for {chosen.name} to {plan.out}/")
    print("  files    " + ", ".join([*plan.files, "README.txt", "export.json"]))
    for warning in plan.warnings:
        print(f"  warning  {warning}")
    for note in plan.notes:
        print(f"  to do    {note}")
    print(f"\nlaunch:\n  {plan.command}")
    return 0
