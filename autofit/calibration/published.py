"""The published set (calibration/published.csv): training runs people measured on real GPUs, each
held against the simulator with the closest knobs.

A row records, in the source's terms, the run's settings and its figure, and what the figure is
(`measure`): torch's allocated peak (`allocated`; torch's active-bytes peak, `active`, is compared
with it), its reserved peak (`reserved`), what nvidia-smi shows (`nvidia_smi`: the reserved peak
plus the CUDA context), or only that the run fitted a card of that size (`ran`) or ran out of memory
there (`oom`). `autofit` holds the closest autofit settings (`model=... gpu=... knob=value ...`)
where autofit can express the run, `differs` what they leave out; a row autofit cannot express
has `needs` instead: what it lacks. A file a row's settings name (a PEFT adapter config) lies in
calibration/, the path relative to it.

`use` says whether a row was used while building or checking a mechanism of the simulator
(`built`) or held out from it (`held_out`); `held_out_error` keeps the error (or verdict) a row
showed when it first became expressible, before anything was changed for it, with the commit it
was measured at. The two kinds are reported apart.

Compared like with like, the error is signed (simulated / published - 1: positive over-estimates).
A false fit is a run autofit says fits at its margin that ran out of memory, or a figure the
margin does not cover: on a card the simulated peak just fills at that margin, the published
figure would not fit. A false out-of-memory: a run that fitted its card (ran, or a figure taken on
it) that autofit says does not fit there at its margin.
"""

from __future__ import annotations

import csv
import os
import shlex
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofit.calibration.margins import AUTO, chosen_margin, load_margins, run_class
from autofit.errors import ConfigError, shown
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, parse_all
from autofit.models import load_preset
from autofit.paths import calibration_dir
from autofit.probe.build import make_spec
from autofit.probe.launcher import launcher_for
from autofit.probe.runner import run_probe
from autofit.records.probe import DOES_NOT_FIT, Outcome
from autofit.units import parsed_value

COLUMNS = (
    "id", "family", "model", "gpu", "method", "trainer", "batch_size", "grad_accumulation",
    "length", "precision", "optimizer", "checkpointing", "lora", "quantization", "other",
    "figure", "unit", "measure", "measure_note", "throughput", "speed", "speed_unit", "source",
    "autofit", "differs", "needs", "use", "held_out_error",
)  # fmt: skip
USES = ("built", "held_out")
MEASURES = ("allocated", "active", "reserved", "nvidia_smi", "ran", "oom")
# The speed a source published, per GPU: tokens per second (of the run's sequence length), or
# seconds per optimizer step (batch x gradient accumulation samples), or samples per second.
SPEED_UNITS = ("tokens/s", "s/step", "samples/s")
UNITS = {"GiB": 1 << 30, "GB": 10**9, "MiB": 1 << 20, "card": 0}


@dataclass(frozen=True)
class PublishedRow:
    """One published run. `settings` holds the source's own columns as recorded."""

    id: str
    family: str
    measure: str
    figure_bytes: int | None  # None for ran / oom rows
    model: str | None  # the closest autofit run, when autofit can express it
    gpu: str | None
    knobs: dict[str, Any] = field(default_factory=dict)
    differs: str = ""
    needs: str = ""
    settings: dict[str, str] = field(default_factory=dict)
    samples_per_s: float | None = None  # the published speed in autofit's unit, where given
    use: str = "held_out"

    @property
    def expressible(self) -> bool:
        return self.model is not None

    @property
    def held_out(self) -> bool:
        return self.use == "held_out"


def published_path() -> Path:
    return calibration_dir() / "published.csv"


def _parse(raw: dict[str, str], where: str) -> PublishedRow:
    measure = raw["measure"]
    if measure not in MEASURES:
        raise ConfigError(
            f"{where}: measure={shown(measure)} is not valid; valid: {', '.join(MEASURES)}"
        )
    if raw["use"] not in USES:
        raise ConfigError(
            f"{where}: use={shown(raw['use'])} is not valid; valid: {', '.join(USES)}"
        )
    unit = raw["unit"]
    if unit not in UNITS:
        raise ConfigError(f"{where}: unit={shown(unit)} is not valid; valid: {', '.join(UNITS)}")
    figure = None
    if measure not in ("ran", "oom"):
        try:
            figure = round(float(raw["figure"]) * UNITS[unit])
        except ValueError:
            raise ConfigError(f"{where}: figure={shown(raw['figure'])} is not a number") from None
    model = gpu = None
    knobs: dict[str, Any] = {}
    if raw["autofit"]:
        settings = dict(word.split("=", 1) for word in shlex.split(raw["autofit"]))
        model, gpu = settings.pop("model", None), settings.pop("gpu", None)
        if not model or not gpu:
            raise ConfigError(f"{where}: autofit= must name a model= and a gpu=")
        try:
            load_preset(model), load_gpu(gpu)
            knobs = {k: parsed_value(v) for k, v in settings.items()}
            for name in knobs:  # a file a row names lies in calibration/
                if name in REGISTRY and REGISTRY[name].names_a_file:
                    knobs[name] = str(published_path().parent / knobs[name])
            parse_all(knobs)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    elif not raw["needs"]:
        raise ConfigError(f"{where}: a row autofit cannot express says what it needs")
    return PublishedRow(
        id=raw["id"], family=raw["family"], measure=measure, figure_bytes=figure, model=model,
        gpu=gpu, knobs=knobs, differs=raw["differs"], needs=raw["needs"], settings=dict(raw),
        samples_per_s=_samples_per_s(raw, knobs, where) if model else None, use=raw["use"],
    )  # fmt: skip


def _samples_per_s(raw: dict[str, str], knobs: dict[str, Any], where: str) -> float | None:
    """The row's published speed as samples per second of the autofit run: tokens over the
    run's sequence length, or the samples of one optimizer step over its seconds."""
    if not raw["speed"]:
        return None
    unit = raw["speed_unit"]
    if unit not in SPEED_UNITS:
        raise ConfigError(
            f"{where}: speed_unit={shown(unit)} is not valid; valid: {', '.join(SPEED_UNITS)}"
        )
    try:
        speed = float(raw["speed"])
        accumulation = int((raw["grad_accumulation"] or "1").split()[0])
    except ValueError:
        raise ConfigError(f"{where}: speed={shown(raw['speed'])} is not a number") from None
    if unit == "tokens/s":
        if "resolution" not in knobs:
            raise ConfigError(f"{where}: a speed in tokens/s needs the run's resolution= (tokens)")
        return speed / int(knobs["resolution"])
    if unit == "s/step":
        return int(knobs.get("batch_size", 1)) * accumulation / speed
    return speed


def load_published(path: Path | None = None) -> list[PublishedRow]:
    """Every row of the published set, checked: a bad one is a one-line error naming it."""
    path = path or published_path()
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: no column {', '.join(missing)}")
        rows = [_parse(raw, f"{path}: row {raw['id']}") for raw in reader]
    ids = [r.id for r in rows]
    doubled = sorted({i for i in ids if ids.count(i) > 1})
    if doubled:
        raise ConfigError(f"{path}: row ids appear twice: {', '.join(doubled)}")
    return rows


# -- comparing -----------------------------------------------------------------------------------


def simulated_figure(row: PublishedRow, result: Any) -> int | None:
    """The simulated counterpart of the row's figure: like with like. A reserved figure was
    taken on the row's card, which bounds it: short of memory, the caching allocator gives its
    cache back and goes on (autofit/simulator/allocator.py), so a run that fits its card but
    would reserve more with memory to spare reserves at most what the card holds besides the
    CUDA context."""
    context = (result.overhead_detail or {}).get("cuda_context", 0)
    if row.measure in ("allocated", "active"):
        return result.peak_allocated_bytes  # type: ignore[no-any-return]
    if row.measure not in ("reserved", "nvidia_smi") or result.peak_reserved_bytes is None:
        return None
    reserved = result.peak_reserved_bytes
    if row.gpu is not None and result.peak_bytes is not None:
        card = load_gpu(row.gpu).memory_bytes
        if result.peak_bytes <= card:
            reserved = min(reserved, card - context)
    return reserved + (context if row.measure == "nvidia_smi" else 0)  # type: ignore[no-any-return]


def compared(row: PublishedRow, result: Any, spec: Any) -> dict[str, Any]:
    """The row's simulated figure and its error (a dict for the CSV); `judged` adds the fit
    verdicts at a margin."""
    simulated = simulated_figure(row, result)
    # the published speed is one GPU's; the simulated one is the whole run's
    speed = result.samples_per_s / int(spec.knobs["world_size"]) if result.samples_per_s else None
    error = None
    if simulated is not None and row.figure_bytes:
        error = simulated / row.figure_bytes - 1
    # Over the host budget (oom_host) is an answer too: the run does not fit, as for oom.
    answered = result.outcome in (Outcome.OK, *DOES_NOT_FIT)
    return {
        "id": row.id, "family": row.family, "model": row.model, "gpu": row.gpu,
        "run_class": run_class(spec.model["family"], spec.knobs), "use": row.use,
        "measure": row.measure, "published_bytes": row.figure_bytes,
        "simulated_bytes": simulated, "error": error,
        "sim_outcome": result.outcome.value, "sim_peak_bytes": result.peak_bytes,
        "sim_phase": result.phase,
        "published_samples_per_s": row.samples_per_s,
        "sim_samples_per_s": speed,
        "throughput_error": speed / row.samples_per_s - 1 if row.samples_per_s and speed else None,
        "crash": "" if answered else (result.error or {}).get("message", ""),
        "differs": row.differs,
    }  # fmt: skip


def judged(outcome: dict[str, Any], margin: float) -> dict[str, Any]:
    """`outcome` with its fit verdicts at `margin` (its run simulated against the whole card, so
    any margin can judge its peak). A figure is a false fit where the margin does not cover its
    error: on a card the simulated peak just fills at that margin, the published figure would
    not fit; a run that ran out of memory is one where the simulated peak is within the budget.
    A false out-of-memory is a run that fitted its card (ran, or a figure taken on it) whose
    simulated peak is over the budget, or over the host's."""
    gpu = load_gpu(outcome["gpu"])
    budget = gpu.budget_bytes(margin)
    answered = not outcome["crash"]
    fits = outcome["sim_outcome"] in ("ok", "oom") and (outcome["sim_peak_bytes"] or 0) <= budget
    if outcome["error"] is not None:
        covered = budget / (1 + outcome["error"]) <= gpu.memory_bytes
        false_fit, false_oom = answered and not covered, answered and not fits
    else:
        ran = outcome["measure"] == "ran"
        false_fit, false_oom = answered and fits and not ran, answered and not fits and ran
    return {**outcome, "margin": margin, "budget_bytes": budget, "fits": answered and fits,
            "false_fit": false_fit, "false_oom": false_oom}  # fmt: skip


def simulate_rows(
    rows: list[PublishedRow],
    margin: Any = AUTO,
    timeout_s: float = 900,
    on_done: Any = None,
) -> list[dict[str, Any]]:
    """Each row simulated with its closest knobs and compared (in the rows' order) at `margin`
    (`auto`: its class's, calibration/margins.yaml). One warm probe server per family, a few
    probes at a time; `on_done(compared)` as each one finishes."""

    outcomes: dict[str, dict[str, Any]] = {}
    jobs = max(1, min(4, os.cpu_count() or 1))
    table = load_margins() if margin == AUTO else None  # read once, not per row

    def one(row: PublishedRow, launcher: Any) -> None:
        assert row.model and row.gpu
        # against the whole card: `judged` weighs the peak at any margin
        spec = make_spec(
            load_preset(row.model), load_gpu(row.gpu), row.knobs, "simulate", 0.0, timeout_s
        )
        done = compared(row, run_probe(spec, launcher=launcher), spec)
        outcomes[row.id] = done = judged(done, margin_of(done, margin, table))
        if on_done:
            on_done(done)

    for family in sorted({r.family for r in rows}):
        group = [r for r in rows if r.family == family]
        # The launcher closes first: on an interrupt its exit ends the running probes (and refuses
        # queued ones) before the pool waits for its threads, so the stop takes seconds.
        with ThreadPoolExecutor(jobs) as pool, launcher_for("simulate", family) as launcher:
            for future in [pool.submit(one, row, launcher) for row in group]:
                future.result()
    return [outcomes[r.id] for r in rows]


def margin_of(outcome: dict[str, Any], margin: Any, table: Any = None) -> float:
    """The margin a compared row is judged at: `margin`, or with `auto` its class's (from
    `table`, else calibration/margins.yaml)."""
    if margin != AUTO:
        return chosen_margin(margin, "", []).value
    if table is not None:
        return table[outcome["run_class"]].margin
    return chosen_margin(AUTO, "", [outcome["run_class"]]).value


def _error_figures(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [o["error"] for o in outcomes if o["error"] is not None]
    absolute = [abs(e) for e in errors]
    return {
        "runs": len(outcomes),
        "compared": len(errors),
        "median_abs": statistics.median(absolute) if absolute else None,
        "max_abs": max(absolute) if absolute else None,
        "mean_signed": statistics.fmean(errors) if errors else None,
        # every answered run is a fit verdict: a figure's run fitted its card
        "verdicts": sum(not o["crash"] for o in outcomes),
        "false_fits": [o["id"] for o in outcomes if o["false_fit"]],
        "false_ooms": [o["id"] for o in outcomes if o["false_oom"]],
    }


def published_figures(outcomes: list[dict[str, Any]], rows: list[PublishedRow]) -> dict[str, Any]:
    """Median and largest |error| over the rows with a figure, the false fits and false
    out-of-memory verdicts, all of them and the held-out and built rows apart, and what the rows
    autofit cannot express need."""
    speeds = [abs(o["throughput_error"]) for o in outcomes if o["throughput_error"] is not None]
    return {
        "rows": len(rows),
        "expressible": sum(r.expressible for r in rows),
        **_error_figures(outcomes),
        "held_out": _error_figures([o for o in outcomes if o["use"] == "held_out"]),
        "built": _error_figures([o for o in outcomes if o["use"] == "built"]),
        "throughput_compared": len(speeds),
        "throughput_median_abs": statistics.median(speeds) if speeds else None,
        "throughput_max_abs": max(speeds) if speeds else None,
        "crashed": [f"{o['id']}: {o['crash']}" for o in outcomes if o["crash"]],
        "not_expressible": {r.id: r.needs for r in rows if not r.expressible},
    }
