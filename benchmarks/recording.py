"""What recording a scan costs the search's parent process: a claim made, then its result and
its other points stored (Prober._record, as a search records each scan), into a fresh SQLite
study, for several trees side by side in one run (this one, and the `--against` checkouts).

    python benchmarks/recording.py [--against PATH ...] [--scans 60] [--points 3] [--repeat 3]

Each tree runs in a fresh interpreter of its own (`--child`), alternately, `--repeat` times; the
median per scan is printed, wall and CPU time, with the trials each wrote (a check that both
record the same thing). A point is a small real result (tiny_mlp's config, every knob).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(scans: int, points: int, folder: str) -> dict[str, float]:
    import optuna

    from autofit.knobs import completed
    from autofit.records.probe import Outcome, ProbeResult, ScanResult
    from autofit.search.prober import Prober
    from autofit.search.recorder import StudyRecorder

    try:  # the key functions' home since issue 34; a tree from before has them in recorder
        from autofit.search.keys import scan_key
    except ImportError:
        from autofit.search.recorder import scan_key  # type: ignore[attr-defined,no-redef]

    recorder = StudyRecorder(f"sqlite:///{folder}/studies.db", "recording", {"model": "m"})
    prober = Prober.__new__(Prober)  # only _record and what it reads
    prober.recorder = recorder
    fingerprints = ("simulate", 10**10, "model", "gpu", None)
    wall = cpu = 0.0
    for scan in range(scans):
        knobs = completed({"resolution": 64, "lora_rank": 1 + scan})
        results = [
            ProbeResult(
                outcome=Outcome.OK if point < points - 1 else Outcome.OOM,
                backend="simulate",
                gpu="a40",
                model="tiny_mlp",
                config={**knobs, "batch_size": 8 + point},
                budget_bytes=10**10,
                peak_bytes=10**9 + point,
                samples_per_s=100.0 - point,
            )  # fmt: skip
            for point in range(points)
        ]
        answer = ScanResult(1, 64, 8 + points - 2, results, [1, 2, 3])
        started, started_cpu = time.perf_counter(), time.process_time()
        structure = {k: v for k, v in knobs.items() if k != "batch_size"}
        claim = recorder.claim(scan_key(knobs, 1, 64, *fingerprints), structure, 60)
        prober._record(answer, claim, fingerprints)
        wall += time.perf_counter() - started
        cpu += time.process_time() - started_cpu
    recorder.close()
    trials = optuna.load_study(study_name="recording", storage=recorder.storage_url).get_trials()
    finished = sum(t.state.is_finished() and t.state.name != "PRUNED" for t in trials)
    return {"wall_ms": 1000 * wall / scans, "cpu_ms": 1000 * cpu / scans, "stored": finished}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", nargs="*", default=[], help="other checkouts to compare")
    parser.add_argument("--scans", type=int, default=60)
    parser.add_argument("--points", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("TREE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.child[0])
        print(json.dumps(child(args.scans, args.points, args.child[1])))
        return
    trees = [str(Path(__file__).resolve().parents[1]), *map(str, args.against)]
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(args.repeat):
        for tree in trees:
            with tempfile.TemporaryDirectory() as folder:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", tree, folder, "--scans",
                     str(args.scans), "--points", str(args.points)],
                    capture_output=True, text=True, check=True, cwd=tree,
                )  # fmt: skip
                runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.scans} scans of {args.points} points each, median of {args.repeat} runs")
    print("| tree | wall ms per scan | CPU ms per scan | trials stored |")
    print("|---|---|---|---|")
    for tree, each in runs.items():
        wall = statistics.median(r["wall_ms"] for r in each)
        cpu = statistics.median(r["cpu_ms"] for r in each)
        print(f"| {tree} | {wall:.1f} | {cpu:.1f} | {each[0]['stored']:.0f} |")


if __name__ == "__main__":
    main()
