"""The seed claim of issue 15: Llama 3.1 70B QLoRA on 48 GB cards (A40, RTX A6000) and 80 GB ones.

    python benchmarks/llm_70b_qlora.py [--cards a40,rtx_a6000,a100_80,h100_80] [--jobs 1] [--model M]
                                       [--space llm_70b_qlora_quick]

For each card, runs the command a user would:

    autofit search model=llama3_1_70b gpu=<card> space=llm_70b_qlora

(search_spaces/llm_70b_qlora.yaml: sequence lengths 512 to 8192 tokens, checkpointing on or off,
paged or plain 8-bit AdamW or AdamW, the full or the chunked loss; llm_70b_qlora_quick: the
guides' recipe, also with activations offloaded), every probe simulated, and reads back its
trials: for each sequence length, the largest batch that fits and the fastest run at that batch
(its checkpointing, optimizer, loss and activation offload), and which of those settings fit at
some batch. One probe of the 70B model costs about a minute and a half of one CPU core (docs/recipes.md),
so a card's search of the full space takes a while. Writes results/benchmarks/<space>.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("results/benchmarks/llm_70b_qlora")
SPACE = "llm_70b_qlora"


def read_trials(trials: Path) -> dict:
    """A search's trials.csv, per sequence length: the largest batch that fits and the fastest
    run at it, or the least peak of those that did not fit."""
    found: dict = {}
    with trials.open() as f:
        probes = [t for t in csv.DictReader(f) if t["outcome"] in ("ok", "oom", "oom_host")]
    found["probes"] = len(probes)
    found["lengths"] = {}
    for length in sorted({int(t["resolution"]) for t in probes}):
        at = [t for t in probes if int(t["resolution"]) == length]
        fits = [t for t in at if t["outcome"] == "ok"]
        if not fits:
            least = min(at, key=lambda t: float(t["peak_gib"] or "inf"))
            found["lengths"][length] = {"fits": False, "least_peak_gib": least["peak_gib"]}
            continue
        batch = max(int(t["batch_size"]) for t in fits)
        fastest = max(
            (t for t in fits if int(t["batch_size"]) == batch),
            key=lambda t: float(t["samples_per_s"] or 0),
        )
        found["lengths"][length] = {
            "fits": True,
            "batch": batch,
            "checkpointing": fastest["checkpointing"],
            "optimizer": fastest["optimizer"],
            "loss": fastest["loss"],
            "offload_activations": fastest.get("offload_activations", "off"),
            "peak_gib": fastest["peak_gib"],
            "tokens_per_s": round(float(fastest["samples_per_s"]) * length),
            "settings_that_fit": sorted(
                {
                    f"{t['checkpointing']}/{t['optimizer']}/{t['loss']}/"
                    f"{t.get('offload_activations', 'off')}"
                    for t in fits
                }
            ),
        }
    return found


def search(model: str, card: str, jobs: int, space: str) -> dict:
    out = OUT / f"{model}-{card}-{space}"
    command = [
        sys.executable, "-m", "autofit", "search", f"model={model}", f"gpu={card}",
        f"space={space}", "backend=simulate", f"jobs={jobs}", f"out={out}",
        f"storage=sqlite:///{OUT / 'studies.db'}",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    row: dict = {
        "model": model,
        "card": card,
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - started),
    }
    trials = out / "trials.csv"
    if not trials.exists():  # the search stopped before its first probe
        row["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return row
    row.update(read_trials(trials))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default="a40,rtx_a6000,a100_80,h100_80")
    parser.add_argument("--jobs", type=int, default=1, help="probes at once (each ~0.5 GiB RAM)")
    parser.add_argument("--model", default="llama3_1_70b", help="another LLM preset, to try it")
    parser.add_argument(
        "--space", default=SPACE, help="llm_70b_qlora_quick: checkpointed, paged 8-bit AdamW only"
    )
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for card in options.cards.split(","):
        rows.append(search(options.model, card, options.jobs, options.space))
        print(json.dumps(rows[-1]), flush=True)
    (OUT.parent / f"{options.space}.json").write_text(json.dumps(rows, indent=2))
    print("| card | tokens | largest batch that fits | fastest run at it | peak | tokens/s |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for r in rows:
        if "lengths" not in r:
            print(f"| {r['card']} | - | exit {r['exit']}: {r.get('error')} | - | - | - |")
            continue
        for length, fit in r["lengths"].items():
            if not fit["fits"]:
                print(
                    f"| {r['card']} | {length} | none (least peak {fit['least_peak_gib']} GiB) | - | - | - |"
                )
                continue
            run = (
                f"checkpointing={fit['checkpointing']} optimizer={fit['optimizer']} "
                f"loss={fit['loss']} offload_activations={fit['offload_activations']}"
            )
            print(
                f"| {r['card']} | {length} | {fit['batch']} | {run} | {fit['peak_gib']} GiB | {fit['tokens_per_s']} |"
            )


if __name__ == "__main__":
    main()
