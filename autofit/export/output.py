"""Writing an export: the target's files, README.txt for people, export.json for scripts."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError
from autofit.export.base import ExportPlan, knob_text
from autofit.export.defaults import MARK, table
from autofit.knobs import asked
from autofit.paths import write_together
from autofit.probe.summary import headroom, provenance
from autofit.units import size

log = logging.getLogger(__name__)


def readme(plan: ExportPlan) -> str:
    """README.txt of an export: the run, the files, the launch command, the training defaults
    with their sources, warnings and what is left to do."""
    point = plan.point
    gpus = f"{point.world_size} GPU{'s' if point.world_size > 1 else ''}"
    lines = [
        f"autofit export: {point.label} of study {point.study}, for {plan.target.name}",
        "",
        f"{point.preset.display} ({point.model}) on {point.gpu}, {provenance(point.backend)}: "
        f"peak {size(point.peak_bytes)} of a {size(point.budget_bytes)} budget "
        f"({headroom(point.peak_bytes, point.budget_bytes)}), {point.samples_per_s:.3f} samples/s",
        "configuration: "
        + " ".join(f"{k}={knob_text(v)}" for k, v in asked(point.config, point.preset).items())
        + " (every other knob at its default)",
        f"batch: {point.micro_batch} per GPU x {gpus} x {point.accumulation} accumulation "
        f"step{'s' if point.accumulation > 1 else ''} = {point.global_batch} per optimizer step",
        f"checked against: {table()[plan.target.name].checked_against}",
        "",
        "files:",
        *(f"  {name:<24} {plan.descriptions[name]}" for name in plan.files),
        "",
        "launch:",
        f"  {plan.command}",
    ]
    lines += _defaults(plan)
    if plan.warnings:
        lines += [
            "",
            "warnings (the trainer cannot express these; the run is the measured one regardless):",
        ]
        lines += [f"  - {w}" for w in plan.warnings]
    if plan.notes:
        lines += ["", "to do before launching:"]
        lines += [f"  - {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"


def _defaults(plan: ExportPlan) -> list[str]:
    """The training hyperparameters the files hold from the trainer's documentation, by source;
    or why the target has none."""
    entry = table()[plan.target.name]
    if entry.none or plan.defaults is None:
        return ["", f"training hyperparameters: none written ({entry.none})"]
    found = plan.defaults
    lines = ["", f"training hyperparameters, {MARK}: {found.what}:"]
    for row in found.rows:
        written = [f"{k}={knob_text(v)}" for k, v in row.settings.items() if k not in plan.kept]
        if written:
            lines += [f"  - {' '.join(written)}", f"    from {row.source}"]
    for key, value in plan.kept.items():
        lines.append(f"  - {key}={knob_text(value)}: the measured configuration's, kept")
    lr = entry.learning_rate
    if found.undocumented:
        lines.append(f"  - {lr}: not documented: {found.undocumented}")
    elif lr not in found.settings:
        lines.append(
            f"  - {lr}: not documented for {found.family} ({found.mode}) as far as autofit "
            "knows; the trainer's own default applies"
        )
    return lines


def _defaults_summary(plan: ExportPlan) -> dict[str, Any]:
    entry = table()[plan.target.name]
    found = plan.defaults
    settings = {} if found is None else found.settings
    return {
        "marked": MARK,
        "trainer": entry.trainer,
        "checked_against": entry.checked_against,
        "settings": {k: v for k, v in settings.items() if k not in plan.kept},
        "sources": {k: found.source_of(k) for k in settings if k not in plan.kept} if found else {},
        "kept_from_the_configuration": plan.kept,
        "learning_rate_undocumented": found.undocumented if found else None,
        "none": entry.none,
    }


def summary(plan: ExportPlan) -> dict[str, Any]:
    point = plan.point
    return {
        "target": plan.target.name,
        "study": point.study,
        "source": str(point.summary_path),
        "point": point.label,
        "model": point.model,
        "gpu": point.gpu,
        # The knobs that ask something of the run; every other knob is at its default.
        "config": asked(point.config, point.preset),
        "gradient_accumulation_steps": point.accumulation,
        "global_batch": point.global_batch,
        "files": sorted([*plan.files, "README.txt"]),
        "command": plan.command,
        "training_defaults": _defaults_summary(plan),
        "warnings": plan.warnings,
        "notes": plan.notes,
    }


def write_export(plan: ExportPlan) -> Path:
    """Write every file of `plan` into its folder, with README.txt and export.json, together or
    not at all (autofit/paths.py write_together): export.json, which scripts read, is the
    folder's commit marker, renamed last."""
    out = plan.out
    files = {
        **plan.files,
        "README.txt": readme(plan),
        "export.json": json.dumps(summary(plan), indent=2) + "\n",
    }
    try:
        write_together(out, files, marker="export.json")
    except OSError as exc:
        raise AutofitError(f"cannot write the export to {out}: {exc.strerror or exc}") from None
    log.info("wrote %s export to %s", plan.target.name, out)
    return out
