"""What the planner saves: its probes and wall time against an exhaustive grid over the same space,
and, on batch size alone, against the finders of Lightning and accelerate.

    python benchmarks/search_cost.py [--model sana_1600m] [--gpu a40] [--space default] [--jobs N]

The grid over the whole default space (12,288 probes for Sana 1600M) is out of reach on a
laptop; the published comparison runs `--space benchmarks/search_cost_space.yaml`, a slice of it
with every batch size and resolution and 8 of its 96 structural combinations.

1. The planner: `autofit search` on a fresh study, timed.
2. The grid: every structural combination x resolution x batch size in the space, each a real
   simulated probe (the same probe the planner runs). The grid's probes are kept in their own
   study under results/benchmarks/, so a rerun reuses them; the wall time reported is the one
   measured when they were computed.
3. Batch size alone, for every combination and resolution, with the grid's answers as the oracle
   (no extra probes): doubling then bisection from 1 (Lightning's `binsearch` finder), plain
   bisection over [1, max], and shrinking by x0.9 from the space's maximum until a batch fits
   (accelerate's `find_executable_batch_size`, which stops at the first batch that fits).

Writes results/benchmarks/search_cost.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autofit.backends import resolve
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.launcher import launcher_for
from autofit.probe.spec import Outcome, ProbeResult
from autofit.search.engine import Search
from autofit.search.pareto import best_config
from autofit.search.prober import Prober
from autofit.search.recorder import StudyRecorder
from autofit.search.space import load_space

OUT = Path("results/benchmarks")


def lightning_binsearch(fits: dict[int, bool], max_batch: int) -> tuple[int, int | None]:
    """Doubling from 1 until a batch fails (or the maximum is reached), then bisection between
    the last that fitted and the first that failed. Returns (probes, batch found)."""
    tried: list[int] = []
    batch, low, high = 1, 0, None
    while True:
        tried.append(batch)
        if fits[batch]:
            low = batch
            if high is None:
                if batch == max_batch:
                    break
                batch = min(2 * batch, max_batch)
                continue
        else:
            high = batch
        if high is not None and high - low <= 1:
            break
        batch = (low + high) // 2
    return len(tried), (low or None)


def bisection(fits: dict[int, bool], max_batch: int) -> tuple[int, int | None]:
    low, high, probes = 0, max_batch + 1, 0
    while high - low > 1:
        middle = (low + high) // 2
        probes += 1
        if fits[middle]:
            low = middle
        else:
            high = middle
    return probes, (low or None)


def accelerate_shrink(fits: dict[int, bool], max_batch: int) -> tuple[int, int | None]:
    """accelerate: start at the largest batch, multiply by 0.9 on each out-of-memory error."""
    batch, probes = max_batch, 0
    while batch >= 1:
        probes += 1
        if fits[batch]:
            return probes, batch
        batch = int(batch * 0.9)
    return probes, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sana_1600m")
    parser.add_argument("--gpu", default="a40")
    parser.add_argument("--space", default="default")
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    options = parser.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{OUT / 'search_cost.db'}"
    preset, gpu = load_preset(options.model), load_gpu(options.gpu)
    space = load_space(options.space, preset)
    backend = resolve("simulate", gpu, gpu.budget_bytes(options.margin))
    tag = f"{preset.name}-{gpu.name}-{space.name}"

    # 1. The planner, on a study of its own.
    planner_study = StudyRecorder(storage, f"planner-{tag}-{int(time.time())}", {})
    with launcher_for(backend, preset.family) as launcher:
        prober = Prober(preset, gpu, backend, options.margin, 900, planner_study, launcher)
        started = time.perf_counter()
        planned = Search(space, prober, jobs=options.jobs).run()
        planner_wall = time.perf_counter() - started

        # 2. The grid, reusing whatever an earlier run of this benchmark computed.
        grid_study = StudyRecorder(storage, f"grid-{tag}", {})
        grid_prober = Prober(preset, gpu, backend, options.margin, 900, grid_study, launcher)
        points = [
            {**knobs, "resolution": resolution, "batch_size": batch}
            for resolution in space.resolutions
            for knobs in space.combinations()
            for batch in range(space.min_batch, space.max_batch + 1)
        ]
        started = time.perf_counter()
        with ThreadPoolExecutor(options.jobs) as pool:
            answers = list(pool.map(grid_prober, points))
        grid_wall_now = time.perf_counter() - started
    new_grid_probes = sum(not reused for _, reused in answers)
    timing_file = OUT / f"search_cost_grid_timing-{tag}.json"
    if new_grid_probes == len(points) or not timing_file.exists():
        timing_file.write_text(
            json.dumps({"probes": new_grid_probes, "wall_s": grid_wall_now, "jobs": options.jobs})
        )
    grid_timing = json.loads(timing_file.read_text())
    grid_results: list[ProbeResult] = [result for result, _ in answers]

    # The grid's answer per combination and resolution.
    oracle: dict[tuple, dict[int, bool]] = {}
    for point, result in zip(points, grid_results, strict=True):
        key = (tuple((k, point[k]) for k in space.knobs), point["resolution"])
        oracle.setdefault(key, {})[point["batch_size"]] = result.outcome is Outcome.OK
    grid_best = best_config(grid_results, space.target_resolution, space.target_min_batch)

    rows = {"lightning": [0, 0], "bisection": [0, 0], "accelerate": [0, 0]}  # probes, exact answers
    exact_batches = {}
    for key, fits in oracle.items():
        truth = max((b for b, ok in fits.items() if ok), default=None)
        exact_batches[key] = truth
        for name, strategy in (
            ("lightning", lightning_binsearch),
            ("bisection", bisection),
            ("accelerate", accelerate_shrink),
        ):
            probes, found = strategy(fits, space.max_batch)
            rows[name][0] += probes
            rows[name][1] += found == truth
    planner_exact = sum(
        1
        for c in planned.combinations
        if c.status in ("exact", "none_fit")
        and c.best_batch
        == exact_batches[(tuple((k, c.knobs[k]) for k in space.knobs), c.resolution)]
    )
    pruned = sum(1 for c in planned.combinations if c.status == "pruned")
    # Where the grid's memory curve is not monotonic in batch size (the allocator's segments can
    # pack a larger batch better than a smaller one), the largest fitting batch and the issue's
    # rule (b* fits, b* + 1 does not) part: name those pairs and whether the planner met the rule.
    non_monotonic = []
    for c in planned.combinations:
        key = (tuple((k, c.knobs[k]) for k in space.knobs), c.resolution)
        fits = oracle[key]
        first_failure = min((b for b, ok in fits.items() if not ok), default=None)
        if first_failure is not None and exact_batches[key] and exact_batches[key] > first_failure:
            b = c.best_batch
            rule = b is not None and fits[b] and (b == space.max_batch or not fits[b + 1])
            non_monotonic.append({
                "pair": f"{c.label()}", "fits": sorted(k for k, ok in fits.items() if ok and k >= first_failure - 1),
                "first_failure": first_failure, "largest_fitting": exact_batches[key],
                "planner": b, "planner_meets_rule": rule,
            })  # fmt: skip
    pairs = len(oracle)
    planner_probes = planned.new_probes + planned.reused_probes
    mean_probe = grid_timing["wall_s"] * grid_timing["jobs"] / max(1, grid_timing["probes"])

    def same(a: ProbeResult | None, b: ProbeResult | None) -> bool:
        return a is not None and b is not None and a.config == b.config

    report = {
        "model": preset.name, "gpu": gpu.name, "space": space.name, "combinations_x_resolutions": pairs,
        "batch_range": [space.min_batch, space.max_batch], "jobs": options.jobs,
        "planner": {"probes": planner_probes, "wall_s": planner_wall, "exact_pairs": planner_exact,
                    "pruned_pairs": pruned, "best": planned.best.config if planned.best else None},
        "grid": {"probes": len(points), "wall_s": grid_timing["wall_s"],
                 "best": grid_best.config if grid_best else None},
        "same_best": same(planned.best, grid_best),
        "batch_only": {name: {"probes": probes, "exact_pairs": exact} for name, (probes, exact) in rows.items()},
        "mean_probe_s_single_job": mean_probe,
        "non_monotonic": non_monotonic,
    }  # fmt: skip
    (OUT / "search_cost.json").write_text(json.dumps(report, indent=2))

    print(f"{preset.name} on {gpu.name}, space {space.name}: {pairs} combinations x resolutions, batch "
          f"{space.min_batch}..{space.max_batch}, {options.jobs} probes at once\n")  # fmt: skip
    print("| method | probes | share of grid | wall time | exact b* | best config |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(f"| planner (fit, extrapolate, verify; {pruned} pairs pruned) | {planner_probes} | "
          f"{planner_probes / len(points):.1%} | {planner_wall:.0f} s | {planner_exact} / {pairs - pruned} searched "
          f"(+{pruned} pruned) | "
          f"{'same as grid' if report['same_best'] else 'DIFFERENT'} |")  # fmt: skip
    print(f"| exhaustive grid | {len(points)} | 100% | {grid_timing['wall_s']:.0f} s | {pairs} / {pairs} | "
          f"{' '.join(f'{k}={grid_best.config[k]}' for k in ('batch_size', 'resolution', *space.knobs)) if grid_best else 'none fits'} |")  # fmt: skip
    for name, label in (("lightning", "doubling then bisection (Lightning)"), ("bisection", "bisection over [1, max]"),
                        ("accelerate", "x0.9 from the max (accelerate)")):  # fmt: skip
        probes, exact = rows[name]
        print(f"| {label}, batch only | {probes} | {probes / len(points):.1%} | ~{probes * mean_probe / options.jobs:.0f} s "
              f"(at the grid's mean probe time) | {exact} / {pairs} | - |")  # fmt: skip

    for pair in non_monotonic:
        print(f"\nnot monotonic: {pair['pair']}: fits up to {pair['first_failure'] - 1}, not at "
              f"{pair['first_failure']}, fits again at {[b for b in pair['fits'] if b > pair['first_failure']]}; "
              f"the planner's b* = {pair['planner']} "
              f"{'meets' if pair['planner_meets_rule'] else 'does not meet'} the rule (b* fits, b* + 1 does not)")  # fmt: skip


if __name__ == "__main__":
    main()
