"""`autofit calibrate`: a calibration set, each case simulated and run for real, into a CSV and
the figures that say how far the simulator is from the real runs."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autofit.backends import cuda_unusable
from autofit.calibration.margins import AUTO, FLOOR, derive_margins, write_margins
from autofit.calibration.published import (
    judged,
    load_published,
    margin_of,
    published_figures,
    simulate_rows,
)
from autofit.calibration.rows import (
    answered,
    append_row,
    describe,
    figures,
    percent,
    read_rows,
    row,
    write_rows,
)
from autofit.calibration.sets import CalibrationCase, load_set
from autofit.config import compose_config
from autofit.errors import ConfigError, shown
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.paths import ensure_writable
from autofit.probe.build import MARGIN, TIMEOUT_S, gpu_from_config, make_spec, probe_margin
from autofit.probe.runner import run_probe
from autofit.results import RESULTS
from autofit.settings import FLAG, TEXT, Rule, built, choice, entry, setting
from autofit.units import size

# The local GPU is the `gpu=` entry when its memory is within this share of the entry's; a larger
# local GPU emulates the entry by capping its allocator.
SAME_GPU_TOLERANCE = 0.02


# `only=`: one row id, or a list of them; nothing (null, empty) is every row.
def _row_ids(value: Any) -> list[str] | None:
    return [str(w) for w in (value if isinstance(value, list) else [value])] if value else None


def _ids(value: Any) -> bool:
    return not isinstance(value, dict) and not (
        isinstance(value, list) and any(isinstance(w, dict | list) for w in value)
    )


ONLY = Rule(_ids, "expected a row id or a list of them, e.g. only=[PF2,DF-15]", _row_ids, True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrateSettings:
    """`autofit calibrate`'s settings, each with its rule; conf/calibrate.yaml gives the defaults
    and says what each means."""

    gpu: dict[str, Any] = entry()
    set: str = setting("default", TEXT)
    measure: str = setting("cuda", choice("cuda", "cpu"))
    margin: float | str = setting("auto", MARGIN)
    timeout_s: float = setting(900.0, TIMEOUT_S)
    out: str | None = setting(None, TEXT.or_null())
    dry_run: bool = setting(False, FLAG)
    only: list[str] | None = setting(None, ONLY)
    rerun: bool = setting(False, FLAG)


def run(overrides: list[str]) -> int:
    return run_config(compose_config("calibrate", overrides))


def _local_device(measure: str, gpu_memory_bytes: int) -> tuple[str, int]:
    """The device the real runs use: its name and memory."""
    if measure == "cpu":
        return "cpu", 0
    import torch  # seconds; only where the real runs are on a GPU

    why = cuda_unusable()
    if why:
        raise ConfigError(
            f"measure=cuda cannot run here: {why}; measure=cpu checks the simulator against "
            "real tensors on the CPU instead",
        )
    properties = torch.cuda.get_device_properties(0)
    if properties.total_memory < gpu_memory_bytes * (1 - SAME_GPU_TOLERANCE):
        raise ConfigError(
            f"the local {properties.name} has {properties.total_memory / 2**30:.1f} GiB, less than "
            f"the target's {gpu_memory_bytes / 2**30:.1f} GiB: calibrate a GPU it can emulate",
        )
    return properties.name, properties.total_memory


def environment(measure: str, device: str) -> dict[str, str]:
    import torch  # seconds; only once the settings are checked

    found = {"torch": torch.__version__, "device": device}
    if measure == "cuda":
        found["cuda"] = str(torch.version.cuda)
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            found["driver"] = done.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            found["driver"] = "unknown (nvidia-smi did not answer)"
    return found


def default_output(gpu: str, measure: str, set_name: str) -> Path:
    name = gpu if set_name == "default" else f"{gpu}-{Path(set_name).stem}"
    if measure == "cpu":
        return Path("results") / "calibration" / f"{name}-cpu.csv"
    return Path("calibration") / f"{name}.csv"


def run_config(cfg: Any) -> int:
    return calibrate(built(CalibrateSettings, cfg))


def calibrate(settings: CalibrateSettings) -> int:
    """The calibration set, each case simulated and run for real; or the published set."""
    if settings.set == "published" and not settings.rerun:
        return run_published(settings)
    if settings.rerun and settings.set != "published":
        raise ConfigError(
            f"rerun=true runs the published set's rows; set={shown(settings.set)} is run for real "
            "without it (drop rerun=true, or give set=published)"
        )
    if settings.only and settings.set != "published":
        raise ConfigError(f"only= names rows of set=published, not of set={shown(settings.set)}")
    gpu = gpu_from_config(settings.gpu)
    # a reservation that leaves nothing fails before any case
    gpu.budget_bytes(FLOOR if settings.margin == AUTO else settings.margin)
    cases = _published_cases(settings.only) if settings.rerun else load_set(settings.set)
    out = (
        Path(settings.out)
        if settings.out
        else default_output(gpu.label, settings.measure, settings.set)
    )
    if settings.dry_run:
        for number, case in enumerate(cases, start=1):
            print(f"[{number}/{len(cases)}] {case.key(gpu.name)}")
        print(f"{len(cases)} cases; the CSV would be {out}")
        return 0
    return _run_cases(cases, gpu, settings, out)


def _published_cases(only: list[str] | None) -> list[Any]:
    """The published rows (those `only=` names, in its order) as cases: each row's closest knobs
    on its own card, named by the row's id."""
    return [
        CalibrationCase(str(r.model), r.gpu, dict(r.knobs), name=r.id)
        for r in _chosen_rows(load_published(), only)
    ]


def _run_cases(cases: list[Any], gpu: Any, settings: CalibrateSettings, out: Path) -> int:
    """Each case simulated and run for real, a CSV row appended as each one finishes; a rerun
    skips the cases the CSV already holds."""
    measure = settings.measure
    device, device_memory = _local_device(measure, gpu.memory_bytes)
    ensure_writable(out)
    env = environment(measure, device)
    preset_of, gpu_of = functools.cache(load_preset), functools.cache(load_gpu)  # read each once
    kept, again = _answered_rows(out, measure)
    done = {r["case"] for r in kept}
    print(f"calibrating {len(cases)} cases on {device} (measure={measure}) into {out}"
          + (f"; {len(done)} already there are kept" if done else "")
          + (f", {again} that crashed or timed out are run again" if again else ""),
          flush=True)  # fmt: skip

    for number, case in enumerate(cases, start=1):
        key = case.key(gpu.name)
        if key in done:
            continue
        target = gpu_of(case.target) if case.target else gpu
        if measure == "cuda" and target.memory_bytes > device_memory * (1 + SAME_GPU_TOLERANCE):
            # A cap can shrink a GPU, not grow it: the real run would not face the target's limit.
            print(
                f"[{number}/{len(cases)}] {key}: skipped, {target.name} is larger than the local {device}"
            )
            continue
        # On a GPU, a target is the local one when their memories agree; any other is emulated.
        emulated = measure == "cpu" or (
            abs(device_memory - target.memory_bytes) > SAME_GPU_TOLERANCE * device_memory
        )
        preset = preset_of(case.model)
        margin = probe_margin(settings.margin, preset, case.knobs).value
        # The simulation (on the host's cores) runs beside the real run: a GPU's lease is short.
        with ThreadPoolExecutor(2) as pool:
            simulated, measured = (
                pool.submit(run_probe, make_spec(preset, target, case.knobs, backend, margin,
                                                 settings.timeout_s))
                for backend in ("simulate", measure)
            )  # fmt: skip
            sim, real = simulated.result(), measured.result()
        values = row(key, case.model, target.name, device, measure, emulated, sim, real, env)
        append_row(out, values)
        print(f"[{number}/{len(cases)}] {key}: " + _compared(values, size), flush=True)

    rows = [r for r in read_rows(out) if r.get("measure") == measure]
    result = figures(rows)
    summary = out.with_suffix(".json")
    summary.write_text(json.dumps({"csv": str(out), "measure": measure, "device": device, **env,
                                   "figures": result}, indent=2))  # fmt: skip
    print(f"\n{describe(result)}\n\nrows in {out}, figures in {summary}")
    return 0


def _answered_rows(out: Path, measure: str) -> tuple[list[dict[str, str]], int]:
    """The CSV's rows of `measure` whose two runs both answered (fits or not), and how many did
    not: a crash or a timeout says nothing of the case and may be fixed since, so its row is
    dropped from the file (rewritten whole) and the case run again."""
    rows = read_rows(out)

    def stale(r: dict[str, str]) -> bool:
        return r.get("measure") == measure and not answered(r)

    dropped = [r for r in rows if stale(r)]
    if dropped:
        write_rows(out, list(rows[0]), [r for r in rows if not stale(r)])
    return [r for r in rows if r.get("measure") == measure and not stale(r)], len(dropped)


def _compared(values: dict[str, Any], size: Any) -> str:
    def peak(prefix: str) -> str:
        bytes_ = values[f"{prefix}_peak_bytes"]
        return values[f"{prefix}_outcome"] + (f" {size(bytes_)}" if bytes_ else "")

    text = f"simulated {peak('sim')}, real {peak('real')}"
    if values["peak_error"] is not None:
        text += f" ({values['peak_error']:+.1%})"
    if values["throughput_error"] is not None:
        text += (
            f"; {values['sim_samples_per_s']:.3f} vs {values['real_samples_per_s']:.3f} samples/s "
            f"({values['throughput_error']:+.1%})"
        )
    if values["real_error"] and values["real_outcome"] not in ("ok", "oom"):
        text += f"; real run: {values['real_error']}"
    return text


def run_published(settings: CalibrateSettings) -> int:
    """Every row of the published set autofit can express (or those `only=` names), simulated
    with its closest knobs and compared like with like; the rows it cannot express, with what
    they need. The whole set (no `only=`) also derives each class's margin from the errors and
    writes calibration/margins.yaml (with `margin=auto`, the default): its verdicts are those at
    the margins it derives; with a margin given, at that margin."""
    rows = load_published()
    out = Path(settings.out) if settings.out else RESULTS / "calibration" / "published.csv"
    whole = not settings.only
    expressible = _chosen_rows(rows, settings.only)
    if settings.dry_run:
        for chosen in expressible:
            print(
                f"{chosen.id}: model={chosen.model} gpu={chosen.gpu} "
                + " ".join(f"{k}={v}" for k, v in chosen.knobs.items())
            )
        print(f"{len(expressible)} of {len(rows)} rows expressible; the CSV would be {out}")
        print("\n".join(needs_lines({r.id: r.needs for r in rows if not r.expressible})))
        return 0
    ensure_writable(out)
    print(
        f"simulating {len(expressible)} of the {len(rows)} published runs (those autofit can "
        "express)",
        flush=True,
    )

    margin = settings.margin
    # The whole set derives the margins first: judged at the table it writes, not the old one.
    derive = whole and margin == AUTO
    ordered = simulate_rows(
        expressible, 0.0 if derive else margin, settings.timeout_s, on_done=_print_row
    )
    table = None
    if derive:
        table = derive_margins(ordered, {r.id: r.held_out for r in rows})
        ordered = [judged(o, margin_of(o, margin, table)) for o in ordered]
    write_rows(out, list(ordered[0]) if ordered else ["id"], ordered)
    figures = published_figures(ordered, rows)
    if table is not None:
        figures["classes"] = {n: c.__dict__ for n, c in table.items()}
        where = write_margins(
            table, {"all": figures, **figures},
            f"the {len(ordered)} expressible runs of calibration/published.csv",
        )  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps({"csv": str(out), "figures": figures}, indent=2))
    print(_describe_published(figures, margin)
          + (f"\n\nmargins in {where}" if table is not None else "")
          + f"\nrows in {out}, figures in {out.with_suffix('.json')}")  # fmt: skip
    return 0


def _chosen_rows(rows: list[Any], only: list[str] | None) -> list[Any]:
    """The expressible rows, or those `only=` names, in its order."""
    expressible = [r for r in rows if r.expressible]
    if not only:
        return expressible
    wanted = only
    known = {r.id: r for r in expressible}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ConfigError(
            f"only={','.join(unknown)}: not an expressible row of the published set; valid: "
            + ", ".join(known)
        )
    return [known[w] for w in wanted]


def _print_row(done: dict[str, Any]) -> None:
    """One compared row as it finishes: its figure against the simulation's, and its speed."""
    error = "" if done["error"] is None else f" ({done['error']:+.1%})"
    published = size(done["published_bytes"]) if done["published_bytes"] else ""
    speed = ""
    if done["throughput_error"] is not None:
        speed = (f"; {done['sim_samples_per_s']:.3f} samples/s against "
                 f"{done['published_samples_per_s']:.3f} ({done['throughput_error']:+.1%})")  # fmt: skip
    print(f"  {done['id']} [{done['use']}]: {done['measure']} {published} published, simulated "
          f"{size(done['simulated_bytes'])}{error}; peak {size(done['sim_peak_bytes'])}"
          f"{speed}", flush=True)  # fmt: skip


def _error_line(label: str, figures: dict[str, Any]) -> str:
    return (
        f"{label:<14} {figures['compared']} figures: median |error| {percent(figures['median_abs'])}, "
        f"max {percent(figures['max_abs'])}, mean signed {percent(figures['mean_signed'])}; "
        f"{figures['verdicts']} verdicts; {len(figures['false_fits'])} false fits, "
        f"{len(figures['false_ooms'])} false ooms"
    )


def _describe_published(figures: dict[str, Any], margin: Any) -> str:
    at = "each class's margin" if margin == "auto" else f"margin={margin}"
    lines = [
        f"published runs: {figures['rows']}, expressible {figures['expressible']}, compared by "
        f"figure {figures['compared']}; verdicts at {at}",
        _error_line("all", figures),
        _error_line("held out", figures["held_out"]),
        _error_line("built on", figures["built"]),
        f"throughput     median |error| {percent(figures['throughput_median_abs'])}, max "
        f"{percent(figures['throughput_max_abs'])} over {figures['throughput_compared']} rows with a "
        "published speed (the roofline)",
    ]
    if "classes" in figures:
        lines.append(f"{'class':<18} {'runs':>4} {'figures':>7} {'held out':>8} {'median':>7} "
                     f"{'worst low':>9} {'margin':>6}")  # fmt: skip
        for name, c in figures["classes"].items():
            thin = "" if c["runs"] >= 5 else "  (little evidence: the widest margin)"
            thin += f"  set by {c['set_by']}" if c["set_by"] else ""
            lines.append(f"{name:<18} {c['runs']:>4} {c['figures']:>7} {c['held_out']:>8} "
                         f"{percent(c['median_abs_error']):>7} {percent(c['worst_under']):>9} "
                         f"{percent(c['margin']):>6}{thin}")  # fmt: skip
    lines += [f"  false fit: {i}" for i in figures["false_fits"]]
    lines += [f"  false oom: {i}" for i in figures["false_ooms"]]
    lines += [f"  crashed: {c}" for c in figures["crashed"]]
    lines += needs_lines(figures["not_expressible"])
    return "\n".join(lines)


def needs_lines(not_expressible: dict[str, str]) -> list[str]:
    """The rows autofit cannot express, grouped by what they need, the largest group first."""
    needs: dict[str, list[str]] = {}
    for row_id, need in not_expressible.items():
        needs.setdefault(need, []).append(row_id)
    lines = [f"not expressible ({len(not_expressible)} rows), by what they need:"]
    lines += [f"  {len(ids):>3} rows ({', '.join(ids[:4])}{', ...' if len(ids) > 4 else ''}): {need}"
              for need, ids in sorted(needs.items(), key=lambda item: -len(item[1]))]  # fmt: skip
    return lines
