"""space=quick for every model family on the smallest card of a memory class: does it answer?

    python benchmarks/quick_everywhere.py [--cards rtx4060_8] [--models sana_600m,sdxl,...]

For each model and card, runs the command a newcomer would:

    autofit search model=<model> gpu=<card> space=quick

and reads back what it answered: the best run of quick itself, or, where quick's runs fit
nothing, of the space it goes on to (its `if_nothing_fits`, small_cards_lora), or the one line
it refused with. Every probe is simulated on this machine; the host budget is the card's typical
machine (conf/gpu/<card>.yaml). Wall and CPU time (this process's children) per search, side by
side. Writes results/benchmarks/quick_everywhere.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("results/benchmarks/quick_everywhere")
# The smallest preset of each family autofit ships (a family's larger presets only need more).
MODELS = "sana_600m,sd35_medium,sd3_controlnet,sdxl,flux_dev,llama3_2_1b,llama3_8b"


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def search(model: str, card: str) -> dict:
    out = OUT / f"{model}-{card}"
    command = [
        sys.executable, "-m", "autofit", "search", f"model={model}", f"gpu={card}",
        "space=quick", f"out={out}", f"storage=sqlite:///{OUT / 'studies.db'}",
    ]  # fmt: skip
    started, cpu = time.perf_counter(), _children_cpu_s()
    done = subprocess.run(command, capture_output=True, text=True)
    row = {
        "model": model, "card": card, "exit": done.returncode,
        "wall_s": round(time.perf_counter() - started), "cpu_s": round(_children_cpu_s() - cpu),
    }  # fmt: skip
    # quick's folder, then the one of the space it went on to where quick fit nothing
    for folder, space in ((out, "quick"), (Path(f"{out}-small_cards_lora"), "small_cards_lora")):
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            continue
        summary = json.loads(summary_path.read_text())
        row["space"] = space
        best = summary.get("best")
        if best:
            config = best["config"]
            row["best"] = " ".join(
                f"{k}={config[k]}"
                for k in ("batch_size", "train_mode", "base_precision", "swap_blocks", "precision",
                          "optimizer", "checkpointing")
                if k in config
            )  # fmt: skip
            row["peak_gib"] = round(best["peak_bytes"] / 2**30, 2)
            row["budget_gib"] = round(summary["budget_bytes"] / 2**30, 2)
            break
    if "best" not in row:
        row["said"] = (done.stderr or done.stdout).strip().splitlines()[-1:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default="rtx4060_8")
    parser.add_argument("--models", default=MODELS)
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for card in options.cards.split(","):
        for model in options.models.split(","):
            rows.append(search(model, card))
            print(json.dumps(rows[-1]), flush=True)
            (OUT.parent / "quick_everywhere.json").write_text(json.dumps(rows, indent=2))
    print("| model | card | answered by | best run | peak / budget | wall | CPU |")
    print("| --- | --- | --- | --- | --- | ---: | ---: |")
    for r in rows:
        if "best" in r:
            cells = f"{r['space']} | {r['best']} | {r['peak_gib']} / {r['budget_gib']} GiB"
        else:
            cells = f"- | exit {r['exit']}: {' '.join(r['said'])} | -"
        print(f"| {r['model']} | {r['card']} | {cells} | {r['wall_s']} s | {r['cpu_s']} s |")


if __name__ == "__main__":
    main()
