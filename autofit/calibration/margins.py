"""The default margin, earned from the published set's errors, per class of run.

A simulated peak that is low by 8% needs a margin of at least 8% for its "fits" to hold: on a card
the simulation just fills, the real run would be 8% over. The published set (calibration/
published.csv) measures how low the simulation runs, and the classes of run differ: a diffusion
LoRA is reproduced knob for knob, an LLM on a 4-bit base or a run sharded over GPUs carries more of
a trainer's stack the probe only approximates. So `margin=auto`, every command's default, takes the
margin of the run's class:

- the smallest margin (in steps of half a percent, at least `FLOOR`) at which no published run of
  the class is a false fit: each figure's under-prediction is covered, and each run its source saw
  run out of memory is simulated over the budget;
- a class backed by fewer than `MIN_EVIDENCE` published runs takes at least the widest margin of
  any class, and every answer of it says how little backs it.

`autofit calibrate set=published` derives the table from a fresh comparison and writes it to
calibration/margins.yaml, which everything else reads. A search whose space spans several classes
uses the widest of their margins: it compares its runs against one budget.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autofit.errors import ConfigError
from autofit.families import REGISTRY as FAMILIES
from autofit.families import is_causal_lm
from autofit.gpus import load_gpu
from autofit.knobs import registry
from autofit.paths import calibration_dir
from autofit.yaml_files import read_yaml

FLOOR = 0.05  # never less: the allocator's fragmentation varies run to run on the same config
STEP = 0.005  # margins are rounded up to half a percent
MIN_EVIDENCE = 5  # published runs of a class below which it takes the widest margin
AUTO = "auto"

# The classes, declared once: a name and what runs it holds.
RUN_CLASSES = {
    "diffusion_adapter": "diffusion models trained with adapters (LoRA, DoRA) on one GPU",
    "diffusion_full": "diffusion models fine-tuned in full on one GPU",
    "llm_adapter": "language models with LoRA or DoRA adapters on a 16-bit base on one GPU",
    # Any method PEFT has, run by PEFT's own code from its config file: each method's code holds
    # what it holds (its own buffers, initialisations, reconstructions), which autofit's LoRA
    # runs never show, so their errors are a class of their own.
    "llm_peft": "language models with any PEFT method from its config (train_mode=peft) on one GPU",
    "llm_kbit": "language models with adapters on a 4-bit base (QLoRA, QDoRA) on one GPU",
    "llm_full": "language models fine-tuned in full (or freeze-tuned) on one GPU",
    "zero": "runs sharded by DeepSpeed ZeRO (over one GPU or several)",
    "fsdp": "runs sharded by FSDP (FSDP1 or FSDP2) over several GPUs",
    # Video clips hold activations of tens of thousands of tokens a sample: what an image run's
    # errors say does not carry over to them until their own published runs do.
    "video": "video diffusion models (any method) on one GPU",
    "other": "models no published run is of (a custom entry, the test models)",
}
# Families of models people publish no runs of: their class is `other`, which no run backs.
UNPUBLISHED_FAMILIES = ("custom", "mlp")
# The knobs that decide a run's class.
CLASS_KNOBS = ("train_mode", "zero_stage", "fsdp", "world_size")


def run_class(family: str, knobs: Mapping[str, Any]) -> str:
    """The class of one run: `knobs` holds its values of CLASS_KNOBS (defaults where absent)."""
    value = {name: knobs.get(name, registry()[name].default) for name in CLASS_KNOBS}
    # world_size above one runs only with one of the two (autofit/knobs/world_size.py)
    if int(value["zero_stage"]) > 0:
        return "zero"
    if value["fsdp"] != "off":
        return "fsdp"
    mode = str(value["train_mode"])
    if family in UNPUBLISHED_FAMILIES:
        return "other"
    if FAMILIES[family].video:
        return "video"
    if not is_causal_lm(family):
        return "diffusion_full" if mode in ("full", "freeze") else "diffusion_adapter"
    if mode in ("qlora", "qdora"):
        return "llm_kbit"
    if mode == "peft":
        return "llm_peft"
    return "llm_full" if mode in ("full", "freeze") else "llm_adapter"


def classes_spanned(family: str, values: Mapping[str, Iterable[Any]]) -> list[str]:
    """Every class a search reaches: `values` holds each class knob's values in its space."""
    ranges = [list(values.get(n, [registry()[n].default])) for n in CLASS_KNOBS]
    found = {
        run_class(family, dict(zip(CLASS_KNOBS, combo, strict=True)))
        for combo in itertools.product(*ranges)
    }
    return sorted(found)


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassMargin:
    """One class's evidence and the margin it earns."""

    name: str
    runs: int  # published runs of the class the comparison answered (figures and verdicts)
    figures: int  # of them, runs with a memory figure
    held_out: int  # of them, runs held out from building the simulator
    median_abs_error: float | None  # over the figures
    worst_under: float | None  # the largest under-prediction, as a share of the published figure
    needed: float  # the smallest margin with no false fit among the class's runs
    margin: float  # what the class takes (needed, or the widest margin when evidence is thin)
    set_by: str | None = None  # the published run that needs the most, when one needs over FLOOR

    @property
    def enough(self) -> bool:
        return self.runs >= MIN_EVIDENCE


@dataclass(frozen=True)
class ChosenMargin:
    """The margin a command uses, and why (the words every answer carries)."""

    value: float
    basis: str

    def words(self) -> str:
        return f"{self.value * 100:g}% ({self.basis})"


def margins_path() -> Path:
    return calibration_dir() / "margins.yaml"


def load_margins(path: Path | None = None) -> dict[str, ClassMargin]:
    """The table `autofit calibrate set=published` wrote: a class's name to its margin."""
    path = path or margins_path()
    data = read_yaml(path, path)
    classes = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(classes, dict) or set(classes) != set(RUN_CLASSES):
        raise ConfigError(
            f"{path}: expected 'classes' with every run class ({', '.join(RUN_CLASSES)}); "
            "rerun: autofit calibrate set=published"
        )
    try:
        return {name: ClassMargin(name=name, **classes[name]) for name in RUN_CLASSES}
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}; rerun: autofit calibrate set=published") from None


def chosen_margin(setting: Any, family: str, classes: list[str]) -> ChosenMargin:
    """The margin of `margin=<setting>`: a number as the user gave it, or `auto`, the widest
    margin of the classes the run (or search) spans, from calibration/margins.yaml."""
    if setting != AUTO:  # checked by the MARGIN rule (autofit/probe/build.py)
        return ChosenMargin(float(setting), "as set")
    table = load_margins()
    widest = max((table[c] for c in classes), key=lambda c: c.margin)
    return ChosenMargin(widest.margin, _basis(widest, classes))


def _basis(chosen: ClassMargin, classes: list[str]) -> str:
    what = f"class {chosen.name}: {chosen.runs} published runs ({chosen.figures} with a figure)"
    if chosen.worst_under is not None:
        what += f", the simulation at most {chosen.worst_under:.1%} low"
    if chosen.set_by:
        what += f"; set by {chosen.set_by}"
    if not chosen.enough:
        what += f"; fewer than {MIN_EVIDENCE}, so the widest margin of any class"
    if len(classes) > 1:
        what += f"; the widest of the search's classes {', '.join(classes)}"
    return what


# -- deriving the table -------------------------------------------------------------------------


def _round_up(margin: float) -> float:
    return round(math.ceil(round(margin / STEP, 6)) * STEP, 4)


def needed_margin(outcome: Mapping[str, Any], gpu: Any) -> float:
    """The smallest margin at which this compared row is no false fit (0 where any is).

    A figure: on a card the simulation just fills at margin m (its peak at the budget), the real
    peak is the budget times published / simulated, which must stay within the card. A run that
    ran out of memory: its simulated peak must be over the budget."""
    memory, reserved = gpu.memory_bytes, gpu.reserved_bytes
    if outcome["error"] is not None:
        ratio = outcome["simulated_bytes"] / outcome["published_bytes"]
        return max(0.0, 1.0 - (memory * ratio + reserved) / memory)
    if outcome["measure"] == "oom" and outcome["sim_peak_bytes"]:
        # strictly over: a step above the margin at which the peak meets the budget
        return max(0.0, 1.0 - (outcome["sim_peak_bytes"] + reserved) / memory + 1e-6)
    return 0.0


def derive_margins(
    outcomes: list[Mapping[str, Any]], held_out: Mapping[str, bool]
) -> dict[str, ClassMargin]:
    """Each class's margin from a comparison of the published set (`compared` rows with their
    `run_class`); `held_out`: a row id to whether it was held out."""
    answered = [o for o in outcomes if not o["crash"]]
    table: dict[str, ClassMargin] = {}
    for name in RUN_CLASSES:
        rows = [o for o in answered if o["run_class"] == name]
        errors = [o["error"] for o in rows if o["error"] is not None]
        unders = [-e for e in errors if e < 0]  # how far short of the published figure
        needs = {o["id"]: needed_margin(o, load_gpu(o["gpu"])) for o in rows}
        most = max(needs, key=needs.__getitem__, default=None)
        needed = max([FLOOR, *needs.values()])
        table[name] = ClassMargin(
            name=name, runs=len(rows), figures=len(errors),
            held_out=sum(held_out.get(o["id"], False) for o in rows),
            median_abs_error=round(statistics.median(abs(e) for e in errors), 4) if errors else None,
            worst_under=round(max(unders), 4) if unders else (0.0 if errors else None),
            needed=_round_up(needed), margin=0.0,
            set_by=most if most is not None and needs[most] > FLOOR else None,
        )  # fmt: skip
    widest = max(c.needed for c in table.values())
    return {
        name: ClassMargin(
            **{**c.__dict__, "margin": c.needed if c.enough else max(c.needed, widest)}
        )
        for name, c in table.items()
    }


def write_margins(
    table: Mapping[str, ClassMargin],
    figures: Mapping[str, Any],
    source: str,
    path: Path | None = None,
) -> Path:
    """The table and the comparison's figures (`figures`: all, held_out and built, each as
    published_figures gives them) as calibration/margins.yaml, written whole, then renamed."""

    path = path or margins_path()
    head = (
        "# The default margin of each class of run (autofit/calibration/margins.py) and the\n"
        f"# figures it comes from: {source}.\n"
        "# Written by `autofit calibrate set=published`: do not edit by hand.\n"
    )
    body = {
        "floor": FLOOR, "min_evidence": MIN_EVIDENCE,
        "figures": {kind: _counted(figures[kind]) for kind in ("all", "held_out", "built")},
        "classes": {n: {k: v for k, v in c.__dict__.items() if k != "name"} for n, c in table.items()},
    }  # fmt: skip
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(head + yaml.safe_dump(body, sort_keys=False))
    temporary.replace(path)
    return path


def _counted(figures: Mapping[str, Any]) -> dict[str, Any]:
    def share(value: Any) -> Any:
        return None if value is None else round(float(value), 4)

    return {
        "runs": figures["runs"], "figures": figures["compared"], "verdicts": figures["verdicts"],
        "median_abs": share(figures["median_abs"]), "max_abs": share(figures["max_abs"]),
        "mean_signed": share(figures["mean_signed"]),
        "false_fits": len(figures["false_fits"]), "false_ooms": len(figures["false_ooms"]),
    }  # fmt: skip


def load_figures(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The published comparison's figures (all, held_out, built) that calibration/margins.yaml
    keeps beside the margins."""
    path = path or margins_path()
    data = read_yaml(path, path)
    figures = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(figures, dict) or not {"all", "held_out", "built"} <= set(figures):
        raise ConfigError(f"{path}: expected 'figures' with all, held_out and built; rerun: "
                          "autofit calibrate set=published")  # fmt: skip
    return figures
