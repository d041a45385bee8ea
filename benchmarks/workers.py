"""Workers on one study: the same space searched by 1, 2 and 4 `autofit search` processes started
at once on a fresh storage (PostgreSQL and SQLite), side by side: wall time, probes run,
duplicate probes, and whether every worker's best is the one a single worker finds.

    python benchmarks/workers.py [--workers 1 2 4] [--storages postgresql sqlite]
                                 [--model tiny_mlp] [--gpu a40] [--postgres URL]

Each worker is the same command (`backend=simulate jobs=1`, so the workers are the only
parallelism), with its own `out=` to compare their answers. Without `--postgres` (a server URL
whose user may create databases), a throwaway PostgreSQL server is started as the tests start
one (tests/postgres.py: Debian's postgresql package). Wall time is the slowest worker's, from
the start of the first to the end of the last, start-up included. The simulated probes are
CPU-bound: more workers than free cores cannot make a search faster.

Writes results/benchmarks/workers.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

OUT = Path("results/benchmarks")
STUDY = "workers"
# Six structural combinations in one wave (checkpointing is left out: it would only add pruned
# savers), batches up to 8: a few probes each, work that splits between workers.
SPACE = """
batch_size: {min: 1, max: 8}
resolution: [x1]
knobs:
  precision: [bf16, fp16]
  optimizer: [adamw, sgd, lion]
  checkpointing: [false]
"""


def _search(folder: Path, storage: str, out: str, model: str, gpu: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "autofit", "search", f"model={model}", f"gpu={gpu}",
        "space=space.yaml", "backend=simulate", "jobs=1", f"storage={storage}",
        f"study={STUDY}", f"out={out}",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def run(folder: Path, storage: str, workers: int, model: str, gpu: str) -> dict[str, Any]:
    """`workers` searches at once on `storage` (fresh): what they did and found."""
    started = time.perf_counter()
    processes = [_search(folder, storage, f"w{i}", model, gpu) for i in range(workers)]
    outputs = [p.communicate()[0] for p in processes]
    wall = time.perf_counter() - started
    failed = [text for p, text in zip(processes, outputs, strict=True) if p.returncode != 0]
    if failed:
        raise SystemExit(f"a worker failed on {storage}:\n{failed[0][-3000:]}")
    summaries = [
        json.loads((folder / f"w{i}" / "summary.json").read_text()) for i in range(workers)
    ]
    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    probes = Counter(
        t.user_attrs["key"]
        for t in trials
        if t.user_attrs.get("kind") == "probe" and t.state in (TrialState.COMPLETE, TrialState.FAIL)
    )
    bests = {json.dumps(s["best"]["config"], sort_keys=True) for s in summaries}
    return {
        "workers": workers,
        "wall_s": round(wall, 1),
        "probes": len(probes),
        "probes_run": sum(s["new_probes"] for s in summaries),
        "run_per_worker": [s["new_probes"] for s in summaries],
        "duplicates": sum(n - 1 for n in probes.values()),
        "lost_claims": sum(1 for t in trials if t.system_attrs.get("autofit:claim") == "lost"),
        "best": json.loads(bests.pop()) if len(bests) == 1 else None,  # None: workers disagree
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--storages", nargs="+", default=["postgresql", "sqlite"])
    parser.add_argument("--model", default="tiny_mlp")
    parser.add_argument("--gpu", default="a40")
    parser.add_argument("--postgres", help="a PostgreSQL server URL (default: start one)")
    options = parser.parse_args()

    server = None
    if "postgresql" in options.storages and not options.postgres:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from postgres import PostgresServer, _bin_dir  # the tests' throwaway server

        bin_dir = _bin_dir()
        if bin_dir is None:
            raise SystemExit("no PostgreSQL server programs: apt-get install postgresql")
        server = PostgresServer(bin_dir)
        server.start()
    rows = []
    try:
        for kind in options.storages:
            for workers in options.workers:
                folder = Path(tempfile.mkdtemp(prefix=f"autofit-workers-{kind}-{workers}-"))
                (folder / "space.yaml").write_text(SPACE)
                if kind == "sqlite":
                    storage = f"sqlite:///{folder / 'studies.db'}"
                elif server is not None:
                    storage = server.database()
                else:
                    storage = _fresh_database(options.postgres)
                row = {"storage": kind, **run(folder, storage, workers, options.model, options.gpu)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if server is not None:
            server.stop()

    for row in rows:
        single = next(r for r in rows if r["storage"] == row["storage"] and r["workers"] == 1)
        row["same_best_as_one_worker"] = row["best"] is not None and row["best"] == single["best"]
    OUT.mkdir(parents=True, exist_ok=True)
    record = {"cpu_count": os.cpu_count(), "load_at_end": os.getloadavg(), "rows": rows}
    (OUT / "workers.json").write_text(json.dumps(record, indent=2))
    print(
        "\n| storage | workers | wall s | probes | run (per worker) | duplicates | lost claims "
        "| same best as 1 worker |\n|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['storage']} | {r['workers']} | {r['wall_s']} | {r['probes']} | "
            f"{r['probes_run']} ({', '.join(map(str, r['run_per_worker']))}) | "
            f"{r['duplicates']} | {r['lost_claims']} | {r['same_best_as_one_worker']} |"
        )


def _fresh_database(server_url: str) -> str:
    import uuid

    import sqlalchemy

    name = f"autofit_workers_{uuid.uuid4().hex[:8]}"
    engine = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return str(sqlalchemy.engine.make_url(server_url).set(database=name))


if __name__ == "__main__":
    main()
