"""Writing an export: the target's files, README.txt for people, export.json for scripts."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError
from autofit.export.base import ExportPlan, knob_text
from autofit.knobs import asked
from autofit.paths import write_together
from autofit.units import size

log = logging.getLogger(__name__)


def _readme(plan: ExportPlan) -> str:
    point = plan.point
    gpus = f"{point.world_size} GPU{'s' if point.world_size > 1 else ''}"
    lines = [
        f"autofit export: {point.label} of study {point.study}, for {plan.target.name}",
        "",
        f"{point.preset.display} ({point.model}) on {point.gpu}, {point.backend} probe: peak "
        f"{size(point.peak_bytes)} of a {size(point.budget_bytes)} budget, "
        f"{point.samples_per_s:.3f} samples/s",
        "configuration: "
        + " ".join(f"{k}={knob_text(v)}" for k, v in asked(point.config, point.preset).items())
        + " (every other knob at its default)",
        f"batch: {point.micro_batch} per GPU x {gpus} x {point.accumulation} accumulation "
        f"step{'s' if point.accumulation > 1 else ''} = {point.global_batch} per optimizer step",
        "",
        "files:",
        *(f"  {name:<24} {plan.descriptions[name]}" for name in plan.files),
        "",
        "launch:",
        f"  {plan.command}",
    ]
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
        "README.txt": _readme(plan),
        "export.json": json.dumps(summary(plan), indent=2) + "\n",
    }
    try:
        write_together(out, files, marker="export.json")
    except OSError as exc:
        raise AutofitError(f"cannot write the export to {out}: {exc.strerror or exc}") from None
    log.info("wrote %s export to %s", plan.target.name, out)
    return out
