"""The training hyperparameters memory does not decide, as each trainer documents them.

`trainer_defaults.yaml` (beside this module) declares them once: for each export target, rows of
settings in the target's own keys, each for some model families and modes (`full`, or `lora` for
any adapter mode) and each with its source; the trainer version they were checked against; the
(family, mode) pairs whose trainer documents no learning rate, and why; and, for a target that
trains nothing of a trainer's (one's own code, autofit probe), why it has none. A layout takes a
run's defaults through `ExportPlan.training_defaults` (autofit/export/base.py), which keeps every
value the measured configuration sets, and writes them marked as defaults to review; the export's
README lists them with their sources (autofit/export/output.py). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from autofit.yaml_files import read_yaml

TABLE = Path(__file__).with_name("trainer_defaults.yaml")
MARK = "defaults to review"  # how every exported file and README names these values
MODES = ("full", "lora")


def mode_of(train_mode: str) -> str:
    """The table's mode of a train_mode: `full` when whole weights train (every block, or the last
    ones), `lora` for any adapter (lora, qlora, dora, qdora)."""
    return "full" if train_mode in ("full", "freeze") else "lora"


@dataclass(frozen=True)
class Row:
    """Settings one source documents, for the families and modes it lists."""

    families: tuple[str, ...]
    modes: tuple[str, ...]
    settings: dict[str, Any]
    source: str

    def covers(self, family: str, mode: str) -> bool:
        return family in self.families and mode in self.modes


@dataclass(frozen=True)
class Undocumented:
    """Families and modes whose trainer documents no learning rate, and what applies instead."""

    families: tuple[str, ...]
    modes: tuple[str, ...]
    why: str

    def covers(self, family: str, mode: str) -> bool:
        return family in self.families and mode in self.modes


@dataclass(frozen=True)
class Defaults:
    """What one run takes from its target's entry: the rows for its family and mode."""

    entry: TrainerEntry
    family: str
    mode: str
    rows: tuple[Row, ...]
    undocumented: str | None  # why the trainer documents no learning rate for this pair

    @property
    def settings(self) -> dict[str, Any]:
        return {key: value for row in self.rows for key, value in row.settings.items()}

    def source_of(self, key: str) -> str:
        return next(row.source for row in self.rows if key in row.settings)

    @property
    def what(self) -> str:
        return (
            f"the documented values of {self.entry.trainer} for {self.family} ({self.mode}), "
            "which memory does not decide"
        )

    @property
    def origin(self) -> str:
        """What the values are, for a comment above them in a file or a note."""
        return f"{self.what} (README.txt gives their sources)"


@dataclass(frozen=True)
class TrainerEntry:
    """One target's declaration in the table."""

    target: str
    trainer: str
    checked_against: str
    learning_rate: str | None  # the key its files hold the learning rate under
    rows: tuple[Row, ...]
    undocumented: tuple[Undocumented, ...]
    none: str | None  # why the target has no trainer defaults at all

    def for_run(self, family: str, train_mode: str) -> Defaults:
        mode = mode_of(train_mode)
        rows = tuple(row for row in self.rows if row.covers(family, mode))
        why = next((u.why for u in self.undocumented if u.covers(family, mode)), None)
        return Defaults(self, family, mode, rows, why)

    def documents_learning_rate(self, family: str, mode: str) -> bool:
        """Whether the entry gives a learning rate for the pair, or says why its trainer has none."""
        return any(
            row.covers(family, mode) and self.learning_rate in row.settings for row in self.rows
        ) or any(u.covers(family, mode) for u in self.undocumented)


def _pairs(declared: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    families, modes = tuple(declared["families"]), tuple(declared["modes"])
    assert set(modes) <= set(MODES), f"{TABLE.name}: modes are {MODES}, not {modes}"
    return families, modes


def _entry(target: str, declared: dict[str, Any]) -> TrainerEntry:
    rows = tuple(
        Row(*_pairs(row), settings=dict(row["settings"]), source=row["source"])
        for row in declared.get("defaults") or []
    )
    undocumented = tuple(
        Undocumented(*_pairs(u), why=u["why"]) for u in declared.get("undocumented") or []
    )
    # No two rows set one key for the same family and mode: a value has one source.
    for at, row in enumerate(rows):
        for other in rows[at + 1 :]:
            shared = set(row.settings) & set(other.settings)
            overlap = [(f, m) for f in row.families for m in row.modes if other.covers(f, m)]
            assert not (shared and overlap), (
                f"{TABLE.name}: {target} sets {', '.join(sorted(shared))} twice for {overlap}"
            )
    return TrainerEntry(
        target=target,
        trainer=declared["trainer"],
        checked_against=declared["checked_against"],
        learning_rate=declared.get("learning_rate"),
        rows=rows,
        undocumented=undocumented,
        none=declared.get("none"),
    )


@cache
def table() -> dict[str, TrainerEntry]:
    """Every target's entry, by target name."""
    declared = read_yaml(TABLE, TABLE.name)
    return {target: _entry(target, entry) for target, entry in declared.items()}
