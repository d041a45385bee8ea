"""How long one simulated probe takes, subprocess included.

    python benchmarks/probe_speed.py [--repeat 3] [--model flux_dev ...]
    python benchmarks/probe_speed.py --against /tmp/base [--repeat 3] [--model sana_1600m]
    python benchmarks/probe_speed.py --phases [--repeat 3] [--model sana_1600m]

For each case it times `run_probe` (the worker process: interpreter start, imports, model build on
fake tensors, two training steps, allocator replay) and the whole `autofit probe` command (adds
Hydra composition and the CLI), and writes the figures to results/benchmarks/probe_speed.json.

`--phases` times what one worker does, in a fresh interpreter as a probe's worker runs, phase by
phase (medians of `--repeat`): importing what `autofit probe`'s fork server imports before the
spec arrives (the worker and the backend: torch), leaving out the libraries the run does not use
(autofit/probe/libraries.py), importing torch._dynamo, then the model family's workload, then
measuring the probe (build, trace, figures) twice in the same process. It writes
results/benchmarks/probe_speed_phases.json.

`--against PATH` compares the whole `autofit probe` command of another checkout (a
`git worktree add PATH <commit>` of the code to compare with) with this one's, side by side: the two
run alternately (A B A B ...: the same machine under the same load), each with its own tree first on
`sys.path`. It prints each one's median wall time and their ratio, checks that every result field
but the wall time is the same in both, and writes results/benchmarks/probe_speed_against.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.runner import run_probe

CASES = [
    # (model, gpu, knobs): Sana as in the probe issue; Flux.1-dev at 1024 px and Llama 3 8B at
    # 4096 tokens, the largest image and language presets, as LoRA runs (how they are trained on
    # one GPU)
    (
        "sana_1600m",
        "a40",
        {"batch_size": 1, "resolution": 1024, "precision": "bf16", "optimizer": "adamw"},
    ),
    (
        "flux_dev",
        "h100_80",
        {"batch_size": 1, "resolution": 1024, "precision": "bf16", "train_mode": "lora"},
    ),
    (
        "llama3_8b",
        "h100_80",
        {"batch_size": 1, "resolution": 4096, "precision": "bf16", "train_mode": "lora"},
    ),
]


def time_probe(model: str, gpu: str, knobs: dict) -> tuple[float, str]:
    spec = make_spec(load_preset(model), load_gpu(gpu), knobs, backend="simulate")
    started = time.perf_counter()
    result = run_probe(spec)
    return time.perf_counter() - started, result.outcome.value


def time_cli(model: str, gpu: str, knobs: dict, out: Path, tree: Path | None = None) -> float:
    """The wall time of `autofit probe`, run from `tree` (a checkout) when given: its code first
    on the path of the command and of the worker it starts."""
    args = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autofit", "probe", f"model={model}", f"gpu={gpu}", "backend=simulate",
         *args, f"out={out.resolve()}"],
        check=True, capture_output=True, **_in_tree(tree),
    )  # fmt: skip
    return time.perf_counter() - started


def _in_tree(tree: Path | None) -> dict:
    if tree is None:
        return {}
    return {"cwd": tree, "env": {**os.environ, "PYTHONPATH": str(tree)}}


def _code_of(tree: Path) -> Path:
    """Where the worker's code comes from when run from `tree`: must be `tree` itself."""
    done = subprocess.run(
        [sys.executable, "-c", "import autofit.probe.worker as w; print(w.__file__)"],
        check=True, capture_output=True, text=True, **_in_tree(tree),
    )  # fmt: skip
    return Path(done.stdout.strip()).resolve()


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


# Fields a result may differ in between two runs of the same probe: how long it took.
TIMING_FIELDS = ("wall_s",)


def _answer(path: Path) -> dict:
    result = json.loads(path.read_text())
    return {k: v for k, v in result.items() if k not in TIMING_FIELDS}


def against(base: Path, repeat: int, only: list[str] | None, out_dir: Path) -> None:
    """Time `autofit probe` of `base` and of this checkout alternately; compare their answers."""
    here = Path(__file__).resolve().parents[1]
    for tree in (base, here):
        code = _code_of(tree)
        if not code.is_relative_to(tree.resolve()):
            raise SystemExit(f"from {tree} the worker's code comes from {code}, not from {tree}")
    rows = []
    for model, gpu, knobs in CASES:
        if only and model not in only:
            continue
        times: dict[str, list[float]] = {"base": [], "here": []}
        # CPU seconds of the command and every process it waited for (its workers, its fork
        # server and the server's children): less swayed than wall time by other load.
        cpus: dict[str, list[float]] = {"base": [], "here": []}
        answers: dict[str, list[dict]] = {"base": [], "here": []}
        for _ in range(repeat):
            for name, tree in (("base", base), ("here", here)):
                out = out_dir / f"probe_speed_{name}.json"
                cpu_before = _children_cpu_s()
                times[name].append(time_cli(model, gpu, knobs, out, tree))
                cpus[name].append(_children_cpu_s() - cpu_before)
                answers[name].append(_answer(out))
        runs = answers["base"] + answers["here"]
        differ = sorted({k for run in runs for k in run if run.get(k) != runs[0].get(k)})
        base_s, here_s = statistics.median(times["base"]), statistics.median(times["here"])
        base_cpu, here_cpu = statistics.median(cpus["base"]), statistics.median(cpus["here"])
        # Each run against the base run just before it: load that drifts during the benchmark
        # moves both.
        paired = statistics.median(h / b for b, h in zip(times["base"], times["here"], strict=True))
        rows.append({
            "model": model, "gpu": gpu, "knobs": knobs, "base": str(base), "here": str(here),
            "base_s": times["base"], "here_s": times["here"], "ratio": here_s / base_s,
            "paired_ratio": paired, "base_cpu_s": cpus["base"], "here_cpu_s": cpus["here"],
            "differing_fields": differ,
        })  # fmt: skip
        print(
            f"{model:<12} {gpu:<8} autofit probe: base {base_s:6.2f} s, this tree {here_s:6.2f} s "
            f"(medians of {repeat}, alternating); ratio {here_s / base_s:.2f} (median of pairs "
            f"{paired:.2f}); CPU time {base_cpu:.2f} s and {here_cpu:.2f} s, ratio "
            f"{here_cpu / base_cpu:.2f}; "
            + (f"answers DIFFER in {', '.join(differ)}" if differ else "answers identical")
        )
    (out_dir / "probe_speed_against.json").write_text(json.dumps({"cases": rows}, indent=2))
    if any(row["differing_fields"] for row in rows):
        raise SystemExit(1)


# One probe's worker phase by phase, in a fresh interpreter: its spec on stdin, its times out.
PHASES = r"""
import json, sys, time
clock = [time.perf_counter()]
def lap():
    clock.append(time.perf_counter())
    return clock[-1] - clock[-2]
import autofit.probe.worker, autofit.backends.simulate
times = {"worker and backend (torch)": lap()}
from autofit.probe.libraries import leave_out_unused
from autofit.records.probe import ProbeSpec
from autofit.families import REGISTRY
spec = ProbeSpec.from_json(sys.stdin.read())
left_out = leave_out_unused([spec])
import torch._dynamo
times["torch._dynamo"] = lap()
__import__(REGISTRY[spec.model["family"]].workload)
times["the model family's workload"] = lap()
autofit.probe.worker.execute(spec)
times["build, trace and figures"] = lap()
autofit.probe.worker.execute(spec)
times["the same, again in this process"] = lap()
print(json.dumps({"left_out": left_out, "times": times}))
"""


def phases(repeat: int, only: list[str] | None, out_dir: Path) -> None:
    rows = []
    for model, gpu, knobs in CASES:
        if only and model not in only:
            continue
        spec = make_spec(load_preset(model), load_gpu(gpu), knobs, backend="simulate")
        runs = []
        for _ in range(repeat):
            done = subprocess.run(
                [sys.executable, "-c", PHASES], input=spec.to_json(), capture_output=True,
                text=True, check=True,
            )  # fmt: skip
            runs.append(json.loads(done.stdout.splitlines()[-1]))
        medians = {
            phase: statistics.median(run["times"][phase] for run in runs)
            for phase in runs[0]["times"]
        }
        rows.append({"model": model, "gpu": gpu, "knobs": knobs, "left_out": runs[0]["left_out"],
                     "median_s": medians, "runs": runs})  # fmt: skip
        left = ", ".join(runs[0]["left_out"]) or "nothing"
        print(f"{model} on {gpu} (left out: {left}; medians of {repeat}):")
        for phase, seconds in medians.items():
            print(f"  {phase:<34} {seconds:6.2f} s")
    (out_dir / "probe_speed_phases.json").write_text(json.dumps({"cases": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", nargs="*", default=None, help="only these cases (default: all)")
    parser.add_argument(
        "--against", type=Path, default=None, help="a checkout to compare `autofit probe` with"
    )
    parser.add_argument(
        "--phases", action="store_true", help="time one worker's phases, in a fresh interpreter"
    )
    options = parser.parse_args()
    out_dir = Path("results/benchmarks")
    out_dir.mkdir(parents=True, exist_ok=True)
    if options.phases:
        phases(options.repeat, options.model, out_dir)
        return
    if options.against is not None:
        against(options.against, options.repeat, options.model, out_dir)
        return
    rows = []
    for model, gpu, knobs in CASES:
        if options.model and model not in options.model:
            continue
        probes, outcomes = zip(
            *(time_probe(model, gpu, knobs) for _ in range(options.repeat)), strict=True
        )
        clis = [
            time_cli(model, gpu, knobs, out_dir / "probe_speed_result.json")
            for _ in range(options.repeat)
        ]
        row = {
            "model": model,
            "gpu": gpu,
            "knobs": knobs,
            "outcome": outcomes[0],
            "probe_s": {"median": statistics.median(probes), "min": min(probes), "all": probes},
            "cli_s": {"median": statistics.median(clis), "min": min(clis), "all": clis},
        }
        rows.append(row)
        print(
            f"{model:<12} {gpu:<8} {row['outcome']:<4} probe {row['probe_s']['median']:6.2f} s "
            f"(min {row['probe_s']['min']:.2f})   autofit probe {row['cli_s']['median']:6.2f} s "
            f"(min {row['cli_s']['min']:.2f})   median of {options.repeat}"
        )
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (out_dir / "probe_speed.json").write_text(
        json.dumps({"machine": machine, "cases": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
