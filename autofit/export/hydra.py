"""`target=hydra`: the run as Hydra overrides `autofit probe` accepts, to measure it again.

`overrides.yaml` is a YAML list of `key=value` strings, the format Hydra itself records a run's
overrides in (`.hydra/overrides.yaml`): model, GPU, margin and every knob of the run that is not at
a default asking nothing (`autofit probe` runs those at their defaults). Re-measuring on the target
GPU (backend=auto picks `cuda` there) checks the simulated figures for real. Every value of every
knob is autofit's own, so this target expresses them all.
"""

from __future__ import annotations

import yaml

from autofit.command_line import command, override
from autofit.export.base import ExportPlan, Target
from autofit.knobs import asked
from autofit.results import probe_words


def overrides(plan: ExportPlan) -> list[str]:
    """Each override as Hydra reads it back (autofit/command_line.py)."""
    point = plan.point
    head = (
        probe_words(point.summary)
        if point.summary.get("model")
        else [override("model", point.model), override("gpu", point.gpu)]
    )
    margin = point.summary.get("margin")
    if margin is not None:
        head.append(override("margin", margin))
    listed = asked(point.config, point.preset)
    for knob in point.config:
        plan.value(knob)  # read: the rest are at their defaults, as autofit probe runs them
    return head + [override(knob, value) for knob, value in listed.items()]


class Hydra(Target):
    name = "hydra"
    summary = "Hydra overrides for `autofit probe`, to measure the run again (on the real GPU)"

    def build(self, plan: ExportPlan) -> None:

        lines = overrides(plan)
        plan.add(
            "overrides.yaml",
            yaml.safe_dump(lines, sort_keys=False),
            "Hydra overrides (a YAML list, as Hydra records a run's overrides) for autofit probe",
        )
        plan.command = command(["autofit", "probe", *lines])
        plan.note(
            "backend=auto (the default) measures on a local GPU that can hold the budget and "
            "simulates otherwise; add backend=cuda to insist on a real measurement"
        )


TARGET = Hydra()
