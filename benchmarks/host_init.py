"""How long a real probe takes to build its 16-bit model on the host (QLoRA, an fp8 base, swapped
blocks), with random weights drawn as torch draws them and drawn from a tile
(autofit/host_init.py), side by side in one run:

    python benchmarks/host_init.py [--model llama3_8b] [--layers 2] [--repeat 3]

Builds the model's causal LM with `--layers` of its blocks (the embeddings and head whole) in
bf16 on the CPU, each way `--repeat` times alternately, and prints the median wall and CPU time
of each, the parameters a second, and the whole model's time at that rate. Writes
results/benchmarks/host_init.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from autofit.host_init import tiled_random_init
from autofit.models import load_preset
from autofit.workloads.llm import causal_lm_classes


def build_once(config: object, model_class: type, tiled: bool) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    with tiled_random_init() if tiled else nullcontext():
        model = model_class(config)
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    parameters = sum(p.numel() for p in model.parameters())
    del model
    return *elapsed, parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3_8b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    architecture = load_preset(args.model).architecture
    config_class, model_class = causal_lm_classes(architecture["kind"])
    whole = architecture["config"]
    config = config_class(**{**whole, "num_hidden_layers": args.layers})
    full = config_class(**whole)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        total = sum(p.numel() for p in model_class(full).parameters())

    times: dict[str, list[tuple[float, float]]] = {"drawn": [], "tiled": []}
    parameters = 0
    for _ in range(args.repeat):
        for way in times:
            wall, cpu, parameters = build_once(config, model_class, way == "tiled")
            times[way].append((wall, cpu))

    result = {
        "model": args.model, "layers": args.layers, "parameters": parameters,
        "whole_model_parameters": total, "repeat": args.repeat,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
    }  # fmt: skip
    print(f"{args.model}, {args.layers} blocks: {parameters / 1e9:.2f} B parameters in bf16 on the "
          f"CPU ({torch.get_num_threads()} threads), median of {args.repeat}")  # fmt: skip
    for way, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        rate = parameters / wall
        result[way] = {"wall_s": wall, "cpu_s": cpu, "parameters_per_s": rate,
                       "whole_model_s": total / rate}  # fmt: skip
        print(f"  {way:<6} {wall:6.2f} s wall {cpu:6.2f} s CPU  {rate / 1e9:5.2f} B/s  "
              f"the whole {total / 1e9:.2f} B: {total / rate:6.1f} s")  # fmt: skip
    out = Path("results/benchmarks/host_init.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
