"""Does a change move what autofit answers? The README's and the recipes' commands from two
checkouts, each from fresh folders, compared field by field.

    python benchmarks/same_answers.py --against PATH [--out results/benchmarks/same_answers]

PATH is another checkout (a `git worktree add /tmp/base <commit>`). Each command runs in this
checkout and in PATH with the code of that checkout (PYTHONPATH), into a folder of its own; then
the searches' summary.json (every field but timing and the folder's own path), trials.csv and
pareto.csv (every row, timing columns aside), best.yaml, the probe's result JSON, every exported
file and every printed line (progress and timing lines aside) are compared. Prints each and how
many differ; exit 1 if any does. Takes about 15 minutes on 2 cores (the searches are simulated).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

SEARCHES = {
    "sana": ["search", "model=sana_1600m", "gpu=a40"],
    "llama_trl": ["search", "model=llama3_2_1b", "gpu=rtx4090", "space=quick", "trainer=trl"],
    "sdxl_t4": ["search", "model=sdxl", "gpu=t4", "space=quick"],  # goes on to small_cards_lora
}
PROBE = [
    "probe",
    "model=sana_1600m",
    "gpu=a40",
    "batch_size=2",
    "precision=bf16",
    "checkpointing=true",
]
EXPORTS = {  # results folder -> targets
    "sana": [
        "accelerate",
        "deepspeed",
        "simpletuner",
        "kohya",
        "sana",
        "diffusers",
        "trl",
        "hydra",
    ],
    "llama_trl": ["trl", "accelerate"],
    "sdxl_t4-small_cards_lora": ["kohya", "simpletuner", "diffusers"],
}
TIMING = {"wall_s", "versions", "study", "storage", "overrides", "rerun"}
PROGRESS = re.compile(r"^\[\d\d:\d\d\]|probes? \(\d+ run, \d+ reused\) in \d+ s")


def run(tree: Path, out: Path, name: str, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-m", "autofit", *args], cwd=tree, env=env, capture_output=True, text=True
    )  # fmt: skip
    (out / f"{name}.log").write_text(done.stdout + done.stderr)


def answers(tree: Path, out: Path) -> None:
    out.mkdir(parents=True)
    storage = f"storage=sqlite:///{out / 'studies.db'}"
    run(tree, out, "probe", [*PROBE, f"out={out / 'probe.json'}"])
    for name, args in SEARCHES.items():
        run(tree, out, name, [*args, f"out={out / name}", storage])
    for folder, targets in EXPORTS.items():
        for target in targets:
            name = f"export-{folder}-{target}"
            run(tree, out, name, ["export", f"from={out / folder}", f"target={target}", f"out={out / name}"])  # fmt: skip


def leaves(value: object, path: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        found: dict[str, object] = {}
        for key, inner in value.items():
            if key not in TIMING:
                found |= leaves(inner, f"{path}.{key}")
        return found
    if isinstance(value, list):
        return {
            k: v for i, inner in enumerate(value) for k, v in leaves(inner, f"{path}[{i}]").items()
        }
    return {path: value}


def rows(path: Path) -> list[str]:
    kept = [
        {k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(path.open())
    ]
    return sorted(json.dumps(row, sort_keys=True) for row in kept)


def text(path: Path, out: Path) -> list[str]:
    lines = path.read_text().replace(str(out), "OUT").splitlines()
    return [line for line in lines if not PROGRESS.search(line)]


def compare(a: Path, b: Path) -> int:
    differ = 0
    for file in sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.suffix != ".db"):
        x, y = a / file, b / file
        if not y.exists():
            same, what = False, "missing"
        elif file.name in ("summary.json", "probe.json"):
            fields = leaves(json.loads(x.read_text()))
            same, what = fields == leaves(json.loads(y.read_text())), f"{len(fields)} fields"
        elif file.suffix == ".csv":
            same, what = rows(x) == rows(y), f"{len(rows(x))} rows"
        else:
            same, what = text(x, a) == text(y, b), f"{len(text(x, a))} lines"
        differ += not same
        print(f"{'same   ' if same else 'DIFFERS'} {file} ({what})")
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/same_answers"))
    options = parser.parse_args()
    out = options.out.resolve()
    this, against = out / "this", out / "against"
    for folder in (this, against):
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    answers(Path.cwd(), this)
    answers(options.against.resolve(), against)
    differ = compare(this, against)
    print(f"{differ} files differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
