"""What every exporter shares: the contract of a target, and the plan of one export.

A target is a layout: the files its trainer reads, and the command that launches it. What each
knob's value becomes in those files is the knob's own declaration (its `trainers` words,
autofit/knobs/base.py), read through the plan:

- `plan.say(knob)` returns the knob's settings in the target's vocabulary (and records the
  note, the warning and any file that come with them), or stops the export with one line naming
  the target, the knob, the value and what the trainer offers instead, when the trainer would not
  run what was measured (ZeRO without DeepSpeed, a weight dtype it does not have, more memory);
- `plan.say_rest()` says every knob the layout has not read yet, in the registry's order;
- `plan.value(knob)` is for the few values a layout writes itself (the batch into a dataset file);
- `plan.training_defaults(said)` gives the trainer's documented training hyperparameters that
  memory does not decide (learning rate, steps, the family's flags: autofit/export/defaults.py),
  for the layout to write marked as defaults to review, never over a value the knobs said.

A knob at its default that asks nothing of a trainer passes through silently; a knob the plan's
configuration has but autofit does not know (from a newer autofit) stops the export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from autofit.errors import ConfigError
from autofit.export.defaults import MARK, Defaults, table
from autofit.export.point import StudyPoint
from autofit.families import REGISTRY as FAMILIES
from autofit.families import TRAINERS, trained_by
from autofit.knobs import REGISTRY, Refuse, Subject
from autofit.models import ModelPreset
from autofit.units import value as knob_text  # a knob value as the command line writes it


class Refused(ConfigError):
    """A trainer cannot run one of the configuration's values as measured."""

    def __init__(self, message: str, target: str, knob: str, value: Any, why: str, offers: str):
        super().__init__(message)
        self.target, self.knob, self.value, self.why, self.offers = target, knob, value, why, offers

    @property
    def short(self) -> str:
        """The refusal without the study's name: for a search's list of invalid combinations."""
        return f"{self.target} cannot run {self.knob}={knob_text(self.value)}: {self.why}; {self.target} offers {self.offers}"


@dataclass
class ExportPlan:
    """What one export writes: files, the launch command, warnings, and the settings the user's own
    code must apply. `out` is the folder the files go to, as the user will type it."""

    target: Target
    point: StudyPoint
    out: Path
    files: dict[str, str] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    command: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)
    written_by_layout: set[str] = field(default_factory=set)  # knobs read through value()
    defaults: Defaults | None = None  # the trainer's documented values, once the layout asked
    kept: dict[str, Any] = field(default_factory=dict)  # defaults' keys the knobs said otherwise

    @property
    def subject(self) -> Subject:
        return Subject(self.point.config, self.point.preset, self.point.accumulation, self.out)

    def value(self, knob: str) -> Any:
        """The knob's value, which the layout expresses itself."""
        self.read.add(knob)
        self.written_by_layout.add(knob)
        return self.point.config[knob]

    def say(self, knob: str, vocabulary: str | None = None, record: bool = True) -> dict[str, Any]:
        """The knob's settings in `vocabulary` (the target's own by default); the knob is then
        read, and its note, warning and files go into the export. With `record` false (a second
        file in another trainer's words), nothing is recorded: the knob is still to be said in
        the target's own words. A refusal stops the export either way."""
        declared, value = REGISTRY[knob], self.point.config[knob]
        language = vocabulary or self.target.vocabulary
        own_code = self.target.own_code and language == self.target.vocabulary
        words = declared.express(language, value, self.subject, own_code)
        if isinstance(words, Refuse):
            offers = words.offers or declared.offers(language, self.subject, own_code)
            self.refuse(knob, words.why, offers)
        if record:
            self.read.add(knob)
            if words.note:
                self.notes.append(words.note)
            if words.warning:
                self.warnings.append(f"{knob}={knob_text(value)}: {words.warning}")
            for name, (text, description) in words.files.items():
                self.add(name, text, description)
        return dict(words.settings)

    def say_rest(self) -> dict[str, Any]:
        """Say every knob not read yet, in the registry's order; their settings merged."""
        settings: dict[str, Any] = {}
        for knob in REGISTRY:
            if knob not in self.read:
                settings.update(self.say(knob))
        return settings

    def settings_in(self, vocabulary: str, knobs: list[str] | None = None) -> dict[str, Any]:
        """The settings of every knob that has words in another trainer's vocabulary (or of
        `knobs`), for a file in that trainer's format: SimpleTuner's DeepSpeed config, the
        accelerate config a diffusers script is launched with. Nothing is recorded."""
        names = knobs or [k for k, knob in REGISTRY.items() if vocabulary in knob.trainers]
        settings: dict[str, Any] = {}
        for knob in names:
            settings.update(self.say(knob, vocabulary, record=False))
        return settings

    def training_defaults(self, said: Mapping[str, Any], unmarked_in: str = "") -> dict[str, Any]:
        """The trainer's documented values for this run's family and mode that memory does not
        decide (autofit/export/trainer_defaults.yaml), in the target's keys, for the layout to
        write as defaults to review. A key the knobs said (`said`, in the layout's keys) keeps the
        knobs' value. `unmarked_in` names the file that holds them when it cannot mark them (JSON
        has no comments): the note printed with the export, and README.txt, say so."""
        found = table()[self.target.name].for_run(
            self.point.family, self.point.config["train_mode"]
        )
        self.defaults = found
        written: dict[str, Any] = {}
        for key, value in found.settings.items():
            if key in said and said[key] != value:
                self.kept[key] = said[key]  # what memory decided stays as measured
            else:
                written[key] = value
        if written:
            listed = " ".join(f"{key}={knob_text(value)}" for key, value in written.items())
            unmarked = (
                f"; {unmarked_in} holds them unmarked (JSON has no comments)" if unmarked_in else ""
            )
            self.note(f"{MARK}: {listed} are {found.origin}{unmarked}")
        lr = found.entry.learning_rate
        if found.undocumented:
            self.note(f"choose {lr} for {found.family} ({found.mode}): {found.undocumented}")
        elif lr not in written and lr not in self.kept:
            self.note(
                f"choose {lr}: autofit knows no documented value of {found.entry.trainer} for "
                f"{found.family} ({found.mode}); the trainer's own default applies"
            )
        return written

    @property
    def defaults_heading(self) -> str:
        """The comment a file puts above the defaults it holds."""
        assert self.defaults is not None, "training_defaults() comes first"
        return f"{MARK}: {self.defaults.origin}"

    def refuse(self, knob: str, why: str, offers: str) -> NoReturn:
        """The trainer cannot express this value, and the run would not be the measured one."""
        value = self.point.config[knob]
        target = self.target.name
        offered = offers or f"no other {knob}"
        raise Refused(
            f"target={target} cannot express {knob}={knob_text(value)} of {self.point.model} "
            f"({self.point.label} of {self.point.study}): {why}; {target} offers {offered}",
            target, knob, value, why, offered,
        )  # fmt: skip

    def note(self, text: str) -> None:
        """A setting the user's own code or command applies (the target has no file for it)."""
        self.notes.append(text)

    def add(self, name: str, text: str, description: str) -> Path:
        """Write `text` to `name` in the export; return the path the user will type."""
        self.files[name] = text if text.endswith("\n") else text + "\n"
        self.descriptions[name] = description
        return self.out / name


class Target:
    """One trainer autofit exports to.

    Subclasses set `name`, `summary` (one line for --help and docs/export.md), and `own_code`
    when the knobs the target's files cannot hold become notes of what one's training code must
    do. The families it trains are theirs to declare (`families`). `build` writes the layout
    through the plan (module docstring), adds the files with `plan.add`, and sets `plan.command`
    to the shell line that launches training with them.
    """

    name: str = ""
    summary: str = ""
    own_code: bool = False

    @property
    def families(self) -> Mapping[str, str] | None:
        """The model families the trainer can train, each mapped to what the trainer calls it
        (its script or model name), as the families declare it (autofit/families/); None: any
        family, for targets that configure one's own training code."""
        return trained_by(self.name) if self.name in TRAINERS else None

    @property
    def vocabulary(self) -> str:
        """Whose words the knobs speak for this target: its own."""
        return self.name

    def trains(self, family: str) -> bool:
        """Whether this trainer has a script for the model family."""
        return self.families is None or family in self.families

    def check_family(self, preset: ModelPreset, setting: str = "target") -> None:
        """Refuse a model whose family this trainer has no script for, or a preset of a family it
        trains that its declaration refuses (`refused_presets`); `setting` is the word the user
        wrote it with (target= for an export, trainer= for a search)."""
        if self.trains(preset.family):
            declared = FAMILIES.get(preset.family)
            trainer = declared.trainer(self.name) if declared is not None else None
            why = getattr(trainer, "refused_presets", {}).get(preset.name) or self.preset_refusal(
                preset
            )
            if why:
                raise ConfigError(
                    f"{setting}={self.name} cannot train {preset.name} ({preset.display}): {why}"
                )
            return
        supported = ", ".join(sorted(self.families or ())) or "none"
        raise ConfigError(
            f"{setting}={self.name} cannot train {preset.name} ({preset.display}, family "
            f"{preset.family}): {self.name} supports the families {supported}"
        )

    def preset_refusal(self, preset: ModelPreset) -> str | None:
        """Why this trainer cannot train `preset` of a family it trains, where its own models
        decide it (torchtune's builders, LitGPT's configs); None where it can."""
        return None

    def build(self, plan: ExportPlan) -> None:
        raise NotImplementedError

    def run(self, point: StudyPoint, out: Path) -> ExportPlan:
        """Plan the export of `point` into `out`; nothing is written yet."""
        unknown = [k for k in point.config if k not in REGISTRY]
        if unknown:
            knobs = ", ".join(f"{k}={knob_text(point.config[k])}" for k in unknown)
            raise ConfigError(
                f"target={self.name} does not know the knob(s) {knobs} of {point.model}: "
                "this autofit predates them, and dropping them would export a different run"
            )
        self.check_family(point.preset)
        plan = ExportPlan(self, point, out)
        self.build(plan)
        missed = [k for k in REGISTRY if k not in plan.read]
        assert not missed, f"target {self.name} left knobs unsaid: {', '.join(missed)}"
        assert plan.command, f"target {self.name} set no launch command"
        return plan


def steps_note(plan: ExportPlan, length: str) -> None:
    """How the trainer's steps follow from the user's dataset: what one optimizer step takes, and
    `length`, how many steps the trainer's own settings then make (in its words)."""
    point = plan.point
    gpus = f"{point.world_size} GPU{'s' if point.world_size > 1 else ''}"
    plan.note(
        f"steps: one optimizer step takes {point.micro_batch} per GPU x {gpus} x "
        f"{point.accumulation} accumulation = {point.global_batch} samples; {length}"
    )


def weights(plan: ExportPlan) -> str:
    """The weights to train: the preset's published ones, or a placeholder and a note."""
    known = plan.point.preset.weights
    if known:
        return known
    placeholder = f"path/to/{plan.point.model}"
    plan.note(
        f"autofit does not know where the weights of {plan.point.model} are published: replace "
        f"'{placeholder}' with their path or hub id"
    )
    return placeholder
