"""What finding a step's least memory costs when replays go on from a copy, against replaying each
from the first event.

    python benchmarks/required_memory.py [--model sana_1600m] [--resolution 1024]
        [--batches 5,6,7] [--repeat 3]

Traces the model's two steps at each batch (bf16 autocast, AdamW; the default batches: just over
the largest that fits an A40 at 1024 px) on the A40, then times `required_memory` (autofit/simulator/allocator_replay.py) on each step's log under the A40's budget,
alternately as it runs (its replays under a limit go on from a copy of the plentiful replay where
the limit first matters) and with every replay from the first event, for both allocator settings.
Prints the median of each, checks the two give the same answer, and writes
results/benchmarks/required_memory-<model>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from autofit.fastpath.scan import TracedPoint
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.worker import versions
from autofit.simulator import allocator_replay
from autofit.simulator.allocator import MODELS
from autofit.simulator.allocator_replay import required_memory

GOES_ON = allocator_replay._Progress.run


def from_the_start(self: Any, events: Any, sizes: Any, watch: int | None = None) -> Any:
    """The replay without the copy where the limit first matters: every replay from the start."""
    return GOES_ON(self, events, sizes)


def timed(
    log: Any, workspace: int, limit: int, setting: str, start_over: bool
) -> tuple[float, Any]:
    allocator_replay._Progress.run = from_the_start if start_over else GOES_ON  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        need = required_memory(log.events, log.sizes, [workspace], limit, setting)
        return time.perf_counter() - started, need
    finally:
        allocator_replay._Progress.run = GOES_ON  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sana_1600m")
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--batches", default="5,6,7")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    gpu = load_gpu("a40")
    rows = []
    for batch in (int(b) for b in options.batches.split(",")):
        knobs = {"batch_size": batch, "resolution": options.resolution}
        spec = make_spec(load_preset(options.model), gpu, knobs, backend="simulate")
        log = TracedPoint(spec, versions()).log
        limit = spec.budget_bytes - gpu.cuda_context_bytes
        for setting in sorted(MODELS):
            times: dict[str, list[float]] = {"from a copy": [], "from the start": []}
            answers = {}
            for _ in range(options.repeat):
                for name in times:
                    seconds, answers[name] = timed(
                        log, gpu.cublas_workspace_bytes, limit, setting, name == "from the start"
                    )
                    times[name].append(seconds)
            same = answers["from a copy"] == answers["from the start"]
            row = {"batch": batch, "allocator": setting, "fits": answers["from a copy"].fits,
                   "seconds": times, "same_answer": same}  # fmt: skip
            rows.append(row)
            copy, start = (statistics.median(times[name]) for name in times)
            print(
                f"batch {batch:3d} {setting:<20} {'fits' if row['fits'] else 'over':4}: "
                f"from a copy {copy:5.2f} s, from the start {start:5.2f} s, "
                f"same answer: {'yes' if same else 'NO'}"
            )
    out = Path("results/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"required_memory-{options.model}.json").write_text(json.dumps(rows, indent=2))
    if not all(row["same_answer"] for row in rows):
        raise SystemExit("the two ways gave different answers")


if __name__ == "__main__":
    main()
