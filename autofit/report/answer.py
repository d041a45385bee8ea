"""The report's first words: the answer, in a box above everything else.

The best run (its knobs, samples/s and peak), its headroom (the budget less its peak), the command
that exports it, and how far to trust its figures: measured on the GPU, or simulated, and then
what the published comparison found, held-out runs first (calibration/margins.yaml, which
`autofit calibrate set=published` writes; tests/test_report.py holds the README and docs/accuracy.md to it).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from autofit.command_line import command, override
from autofit.errors import ConfigError
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.summary import headroom, provenance
from autofit.report.tables import config_words, margin_words, nothing_fits
from autofit.results import Study
from autofit.results.layout import RESULTS
from autofit.units import size


def published_words() -> str:
    """How simulated peaks compared with runs people published, held-out runs first (the
    figures calibration/margins.yaml keeps; `autofit calibrate set=published` reruns it)."""
    # lazy: keeps the calibration table's module off `autofit report`'s start-up path
    from autofit.calibration.margins import load_figures

    figures = load_figures()

    def errors(kind: dict[str, Any]) -> str:
        if not kind["figures"]:
            return "none with a memory figure"
        return (
            f"{kind['figures']} with a memory figure, the simulated peak within a median "
            f"{kind['median_abs']:.1%} of it (at most {kind['max_abs']:.1%}, on average "
            f"{kind['mean_signed']:+.1%})"
        )

    held, every = figures["held_out"], figures["all"]
    return (
        f"of {held['runs']} published runs held out from building it, {errors(held)}; of all "
        f"{every['runs']}, {errors(every)}; at the margin of each class {every['false_fits']} "
        f"false fits and {every['false_ooms']} false out-of-memory verdicts"
    )


# How each backend measures, as the trust line says it.
MEASURED = {
    "cuda": "real steps on the GPU, peaks from the CUDA caching allocator, timed steps",
    "cpu": "real steps on the CPU, without a GPU's overheads (CUDA context, workspaces)",
}


# The text box's width: its words wrap to it, a command never (it is copied whole).
WIDTH = 100


class Line(NamedTuple):
    label: str  # "" continues the line above
    words: str
    command: bool = False  # a command to copy: one line, never wrapped


@dataclass
class Answer:
    """The box: a title and its lines, which the text and the HTML page both render."""

    title: str
    lines: list[Line] = field(default_factory=list)

    def text(self) -> str:
        width = max(len(line.label) for line in self.lines)
        body = []
        for line in self.lines:
            words = [line.words] if line.command else textwrap.wrap(
                line.words, WIDTH - width - 4, break_long_words=False, break_on_hyphens=False
            )  # fmt: skip
            labels = [line.label, *[""] * (len(words) - 1)]
            body += [f"| {label.ljust(width)}  {w}" for label, w in zip(labels, words, strict=True)]
        return "\n".join([f"+-- {self.title} ".ljust(WIDTH, "-"), *body, "+" + "-" * (WIDTH - 1)])


def gpu_memory_bytes(study: Study) -> int:
    """The GPU's total memory: its shipped entry's, where the study's budget is that entry's at the
    study's margin; else what the budget and margin imply (an entry of the user's, or one that
    changed since)."""
    margin = float(study.summary.get("margin") or 0.0)
    try:
        gpu = load_gpu(str(study.summary["gpu"]))
        if gpu.budget_bytes(margin) == study.budget_bytes:
            return gpu.memory_bytes
    except ConfigError:
        pass
    return round(study.budget_bytes / (1.0 - margin))


def export_command(study: Study) -> str:
    """The `autofit export` line that writes this study's best run for a trainer: `study=NAME`
    for a folder under results/, else `from=DIR`; the study's trainer where its search had one."""
    where = (
        override("study", study.path.name)
        if study.path.parent == RESULTS
        else override("from", str(study.path))
    )
    trainer = study.summary.get("trainer")
    target = override("target", str(trainer)) if trainer else "target=TARGET"  # TARGET: a blank
    return command(["autofit", "export", where, target])


def _targets(study: Study) -> str:
    """The export targets that can train the study's model (every one where its preset is not
    here to say)."""
    # lazy: keeps the export registry (every target's module) off `autofit report`'s start-up path
    from autofit.export import TARGETS

    try:
        family = load_preset(str(study.summary["model"])).family
    except (ConfigError, KeyError):
        return f"TARGET: {', '.join(TARGETS)}"
    return f"TARGET: {', '.join(n for n, t in TARGETS.items() if t.trains(family))}"


def trust_words(study: Study) -> str:
    """Where the figures come from: every probe's backend (trials.csv), else the study's; for
    simulated ones, what the published comparison found."""
    backends = [p.backend for p in study.probes if p.backend] or [
        str(study.summary.get("backend") or "")
    ]
    simulated = sum(b == "simulate" for b in backends)
    measured = sorted({b for b in backends if b != "simulate"})
    words = [f"{provenance(b)}: {MEASURED.get(b, 'backend not recorded')}" for b in measured]
    if simulated:
        share = "" if not measured else f" ({simulated} of {len(backends)} probes)"
        words.insert(0, f"{provenance('simulate')}{share}: {published_words()}")
    return "; ".join(words)


def answer(study: Study) -> Answer:
    s = study.summary
    box = Answer(f"the answer: {study.name}, {s.get('model')} on {s.get('gpu')}")
    best, budget = study.best, study.budget_bytes
    margin = margin_words(s.get("margin"))
    limits = f"{size(budget)}: the GPU's {size(gpu_memory_bytes(study))} less a {margin} margin"
    if s.get("margin_basis"):  # a study searched before margins were earned has none
        limits += f" ({s['margin_basis']})"
    if best is None:
        why = (
            "none at the target resolution (the Pareto front lists what fits at the others)"
            if study.pareto
            else nothing_fits(study)
        )
        box.lines += [Line("best run", why), Line("budget", limits),
                      Line("export", "nothing to export")]  # fmt: skip
    else:
        peak = int(best["peak_bytes"])
        box.lines += [
            Line("best run", config_words(best["config"], study.knob_names), command=True),
            Line("", f"{best['samples_per_s']:.3f} samples/s, peak {size(peak)}: "
                     f"{headroom(peak, budget)}"),
            Line("budget", limits),
            Line("export", export_command(study), command=True),
        ]  # fmt: skip
        if not s.get("trainer"):
            box.lines.append(Line("", _targets(study)))
    box.lines.append(Line("trust", trust_words(study)))
    return box
