"""What a search costs, measured side by side in one run: the batch-curve scan, the probe-by-probe
planner it replaced, an exhaustive grid, and one probe of the same model as the unit.

    python benchmarks/search_cost.py [--model sana_1600m] [--gpu a40] [--space default]
        [--grid-space benchmarks/search_cost_space.yaml | --no-grid] [--no-planner] [--jobs N]

1. One probe: `autofit probe model=M gpu=G backend=simulate` at the preset's native resolution
   and batch 1, the whole command timed (interpreter, imports, trace, files), median of two.
2. The scan (today's `autofit search`): each structure's batch curve from three traces, shared
   between structures that differ only in the optimizer and the like, on a fresh study, timed.
3. The planner (the search before curves: fit, extrapolate, verify, one probe per batch it
   asks), on a fresh study, timed. Its answers are compared with the scan's.
4. The grid, on `--grid-space` (a slice of the default space small enough to probe every batch
   of every combination; its study under results/benchmarks/ is reused by a rerun, with the
   wall time measured when it was computed): every point a probe of its own. The scan runs on
   the slice too, and its best configuration and largest batch per combination are compared
   with the grid's: the largest batch that fits, wherever memory is not monotonic.

Wall times on these machines vary about 3x from day to day: read the ratios, measured in one
run. Writes results/benchmarks/search_cost-<model>-<gpu>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autofit.backends import resolve
from autofit.commands.search import left_out_by
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.launcher import launcher_for
from autofit.probe.libraries import libraries_of
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.engine import Search, SearchResult
from autofit.search.prober import Prober
from autofit.search.recorder import StudyRecorder
from autofit.search.space import load_space

OUT = Path("results/benchmarks")
MARGIN = 0.05


def one_probe(model: str, gpu: str, resolution: int, repeat: int = 2) -> float:
    """The median wall time of the whole `autofit probe` command."""
    times = []
    for index in range(repeat):
        out = OUT / f"probe-{model}-{index}.json"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "autofit", "probe", f"model={model}", f"gpu={gpu}",
             "backend=simulate", "batch_size=1", f"resolution={resolution}", f"out={out}"],
            capture_output=True, text=True,
        )  # fmt: skip
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"the probe failed: {done.stderr.strip()[-500:]}")
    return statistics.median(times)


def search(
    model: str, gpu_name: str, space_name: str, jobs: int, scan: bool, storage: str, study: str
) -> tuple[SearchResult, float]:
    preset, gpu = load_preset(model), load_gpu(gpu_name)
    space = load_space(space_name, preset)
    backend = resolve("simulate", gpu, gpu.budget_bytes(MARGIN))
    recorder = StudyRecorder(storage, study, {})
    with launcher_for(backend, preset.family, libraries_of(preset.family, space.knobs)) as launcher:
        prober = Prober(preset, gpu, backend, MARGIN, 900, recorder, launcher, scan=scan)
        started = time.perf_counter()
        # what `autofit search` leaves out without trainer= (bf16 under autocast, fp16 on a card
        # with bf16)
        found = Search(space, prober, jobs=jobs, left_out=left_out_by(space, gpu)).run()
    recorder.close()
    return found, time.perf_counter() - started


def answers(found: SearchResult) -> dict[str, Any]:
    """Each searched combination's largest batch (pruned and invalid ones left out)."""
    return {
        c.label(): c.best_batch
        for c in found.combinations
        if c.status.value in ("exact", "none_fit")
    }


def best(found: SearchResult) -> dict[str, Any] | None:
    return None if found.best is None else found.best.config


def grid(
    model: str, gpu_name: str, space_name: str, jobs: int, storage: str
) -> tuple[dict[str, int | None], dict[str, Any] | None, dict[str, Any], list[str]]:
    """Every batch of every combination of the space, each a probe; per combination the
    largest batch that fits; the best configuration by the search's own rule; the timing; the
    combinations where memory is not monotonic in the batch."""
    from autofit.search.combination import Combination
    from autofit.search.pareto import best_config

    preset, gpu = load_preset(model), load_gpu(gpu_name)
    space = load_space(space_name, preset)
    backend = resolve("simulate", gpu, gpu.budget_bytes(MARGIN))
    tag = f"{preset.name}-{gpu.name}-{space.name}"
    recorder = StudyRecorder(storage, f"grid-{tag}", {})
    points = [
        (
            {**knobs, "resolution": resolution, "batch_size": batch},
            Combination(dict(knobs), resolution),
        )
        for resolution in space.resolutions
        for knobs in space.combinations()
        for batch in range(space.min_batch, space.max_batch + 1)
    ]
    with launcher_for(backend, preset.family) as launcher:
        prober = Prober(preset, gpu, backend, MARGIN, 900, recorder, launcher)
        started = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            done = list(pool.map(prober, [p for p, _ in points]))
        wall_now = time.perf_counter() - started
    recorder.close()
    timing_file = OUT / f"search_cost_grid_timing-{tag}.json"
    new = sum(not reused for _, reused in done)
    if new == len(points) or not timing_file.exists():
        timing_file.write_text(json.dumps({"probes": new, "wall_s": wall_now, "jobs": jobs}))
    fits: dict[str, dict[int, bool]] = {}
    results: list[ProbeResult] = []
    for (point, combination), (result, _) in zip(points, done, strict=True):
        fits.setdefault(combination.label(), {})[point["batch_size"]] = result.outcome is Outcome.OK
        results.append(result)
    largest = {
        label: max((b for b, ok in f.items() if ok), default=None) for label, f in fits.items()
    }
    not_monotonic = [
        label for label, f in fits.items()
        if any(not f[b] and f.get(b + 1) for b in f)
    ]  # fmt: skip
    winner = best_config(results, space.target_resolution, space.target_min_batch, space.best_rule)
    timing = json.loads(timing_file.read_text())
    return largest, None if winner is None else winner.config, timing, not_monotonic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sana_1600m")
    parser.add_argument("--gpu", default="a40")
    parser.add_argument("--space", default="default")
    parser.add_argument("--grid-space", default="benchmarks/search_cost_space.yaml")
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument("--no-planner", action="store_true")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{OUT / 'search_cost.db'}"
    stamp = int(time.time())
    preset = load_preset(options.model)
    report: dict[str, Any] = {"model": options.model, "gpu": options.gpu, "jobs": options.jobs}

    probe_s = one_probe(options.model, options.gpu, preset.resolution)
    report["probe_s"] = probe_s
    scanned, scan_s = search(options.model, options.gpu, options.space, options.jobs, True,
                             storage, f"scan-{options.model}-{options.gpu}-{stamp}")  # fmt: skip
    report["scan"] = {"wall_s": scan_s, "times_probe": scan_s / probe_s,
                      "traces": sum(c.probes for c in scanned.combinations),
                      "best": best(scanned), "largest": answers(scanned)}  # fmt: skip
    rows = [("one probe (`autofit probe`)", probe_s, "-", "-"),
            ("scan (batch curves)", scan_s, report["scan"]["traces"], "-")]  # fmt: skip
    if not options.no_planner:
        planned, plan_s = search(options.model, options.gpu, options.space, options.jobs, False,
                                 storage, f"planner-{options.model}-{options.gpu}-{stamp}")  # fmt: skip
        mine, theirs = answers(scanned), answers(planned)
        report["planner"] = {
            "wall_s": plan_s, "times_probe": plan_s / probe_s, "probes": planned.new_probes,
            "best": best(planned), "largest": theirs,
            "differ": {k: (mine.get(k), theirs[k]) for k in theirs if mine.get(k) != theirs[k]},
        }  # fmt: skip
        rows.append(("planner (probe by probe)", plan_s, planned.new_probes,
                     "same" if best(planned) == best(scanned) else "DIFFERENT"))  # fmt: skip
    if not options.no_grid:
        largest, winner, timing, not_monotonic = grid(
            options.model, options.gpu, options.grid_space, options.jobs, storage
        )
        sliced, slice_s = search(options.model, options.gpu, options.grid_space, options.jobs,
                                 True, storage, f"scan-slice-{options.model}-{stamp}")  # fmt: skip
        mine = answers(sliced)
        report["grid"] = {
            "space": options.grid_space, "probes": timing["probes"], "wall_s": timing["wall_s"],
            "best": winner, "scan_best": best(sliced), "scan_wall_s": slice_s,
            "not_monotonic": not_monotonic,
            "differ": {k: (mine.get(k), v) for k, v in largest.items() if k in mine and mine[k] != v},
            "compared": sum(1 for k in largest if k in mine),
        }  # fmt: skip

    path = OUT / f"search_cost-{options.model}-{options.gpu}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"{options.model} on {options.gpu}, space {options.space}, {options.jobs} jobs\n")
    print("| run | wall | x one probe | traces or probes | best vs scan |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, wall, count, same in rows:
        print(f"| {name} | {wall:.0f} s | {wall / probe_s:.1f} | {count} | {same} |")
    if "planner" in report:
        print(
            f"\nplanner vs scan, combinations whose largest batch differs: {report['planner']['differ'] or 'none'}"
        )
    if "grid" in report:
        g = report["grid"]
        print(f"\ngrid on {g['space']}: {g['probes']} probes in {g['wall_s']:.0f} s; scan of the "
              f"slice {g['scan_wall_s']:.0f} s; best {'same' if g['best'] == g['scan_best'] else 'DIFFERENT'}; "
              f"largest batch differs in {len(g['differ'])} of {g['compared']} combinations "
              f"{g['differ'] or ''}; not monotonic: {g['not_monotonic'] or 'none'}")  # fmt: skip
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
