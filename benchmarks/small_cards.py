"""The kohya seed case: Flux.1-dev LoRA and full fine-tuning on 8, 12, 16 and 24 GB cards.

    python benchmarks/small_cards.py [--cards rtx4060_8,rtx3060_12,rtx4060ti_16,rtx4090] [--model flux_dev]

For each card and each of LoRA and the full fine-tune, runs the command a user would:

    autofit search model=flux_dev gpu=<card> space=small_cards_<mode> trainer=kohya

(sd-scripts' recipes: spaces search_spaces/small_cards_lora.yaml and small_cards_full.yaml), and
reads back its best run: the fastest that fits at 1024 px, with its swap count, peak and speed,
and how many probes the search took. Every probe is simulated on a machine without the card.
Writes results/benchmarks/small_cards.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("results/benchmarks/small_cards")
MODES = ("lora", "full")
# What sd-scripts' documentation says of each card size (README, sd3 branch @ e8965397, and
# docs/flux_train_network.md @ 32f06012): rows KS-1..KS-5 and KS-8 of calibration/published.csv.
KOHYA = {
    ("rtx4060_8", "lora"): "fp8_base, 8-bit AdamW, blocks_to_swap 28, batch 1",
    ("rtx3060_12", "lora"): "fp8_base, 8-bit AdamW, blocks_to_swap 16, batch 1",
    ("rtx4060ti_16", "lora"): "fp8_base, batch 1 (with some blocks_to_swap, 2025 docs)",
    ("rtx4090", "lora"): "fp8_base, 8-bit AdamW, no swap, batch 2",
    ("rtx4060_8", "full"): "none documented (a user: 33 blocks, 'uses 7 GB', issue #1764)",
    ("rtx3060_12", "full"): "'28 blocks may be working with 12GB' (README, 2024-09)",
    ("rtx4060ti_16", "full"): "none documented",
    ("rtx4090", "full"): "Adafactor, fused_backward_pass, full_bf16, blocks_to_swap 8, batch 1",
}


def search(model: str, card: str, mode: str) -> dict:
    out = OUT / f"{model}-{card}-{mode}"
    command = [
        sys.executable, "-m", "autofit", "search", f"model={model}", f"gpu={card}",
        f"space=small_cards_{mode}", "trainer=kohya", f"out={out}",
        f"storage=sqlite:///{OUT / 'studies.db'}",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    row = {"card": card, "mode": mode, "exit": done.returncode, "wall_s": round(wall)}
    summary_path = out / "summary.json"
    if done.returncode != 0 or not summary_path.exists():
        row["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return row
    summary = json.loads(summary_path.read_text())
    best = summary.get("best")
    row["probes"] = summary.get("new_probes", 0) + summary.get("reused_probes", 0)
    if best:
        config = best["config"]
        row.update(
            batch=config["batch_size"],
            swap_blocks=config.get("swap_blocks", 0),
            base_precision=config.get("base_precision", "same"),
            fused_backward=config.get("fused_backward", "off"),
            peak_gib=round(best["peak_bytes"] / 2**30, 2),
            budget_gib=round(summary["budget_bytes"] / 2**30, 2),
            samples_per_s=best["samples_per_s"],
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default="rtx4060_8,rtx3060_12,rtx4060ti_16,rtx4090")
    parser.add_argument("--model", default="flux_dev")
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for card in options.cards.split(","):
        for mode in MODES:
            rows.append(search(options.model, card, mode))
            print(json.dumps(rows[-1]), flush=True)
    (OUT.parent / "small_cards.json").write_text(json.dumps(rows, indent=2))
    print(
        "| card | mode | autofit: fastest that fits | peak / budget | samples/s | probes | wall | sd-scripts documents |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        if "batch" in r:
            words = f"batch {r['batch']}, swap_blocks {r['swap_blocks']}"
            if r["base_precision"] != "same":
                words += f", base_precision {r['base_precision']}"
            if r["fused_backward"] != "off":
                words += f", fused_backward {r['fused_backward']}"
            cells = f"{words} | {r['peak_gib']} / {r['budget_gib']} GiB | {r['samples_per_s']:.3f}"
        else:
            cells = (
                "nothing fits | - | -"
                if r["exit"] == 0
                else f"exit {r['exit']}: {r.get('error')} | - | -"
            )
        kohya = KOHYA.get((r["card"], r["mode"]), "-")
        print(
            f"| {r['card']} | {r['mode']} | {cells} | {r.get('probes', '-')} | {r['wall_s']} s | {kohya} |"
        )


if __name__ == "__main__":
    main()
