"""The contract of a knob: everything that belongs to one setting, declared once.

A knob is a subclass of `Knob` in its own module of autofit/knobs/, listed in `REGISTRY`
(autofit/knobs/__init__.py). Everything else (the CLI, search spaces, the search, stored studies,
exporters, reports) reads the declaration and keeps no table of its own. A knob declares:

- what it is: `name`, `default`, `help`, `kind`, and either `values` (a closed set, each value
  with what it means in one's own training code) or `minimum` (an open integer);
- its rules: `invalid_reason(value, context)`, why a value cannot run with the other knobs' values
  on a GPU for a model (decided without torch, before any probe);
- what it saves, for the search: `saves_memory_over` and `per_sample_memory`;
- how it is applied to a training run: the hooks `prepare` (before the model exists),
  `build_context` (around the model's construction), `apply` (once it exists),
  `forward_context` (around every forward pass) and `after_training`, with the run fields it
  `writes` (it owns them: no other knob may write them) and `reads`, and the knobs it must come
  `after` for reasons the fields do not show (autofit/run_state.py);
- the other knobs whose values it reads (`depends_on`): in its rules, its trainers' words and its
  hooks, wherever it looks at `context.knobs`, `subject.config` or `run.knobs`. The contract
  tests hold every read to it, in the source and as the rules and words run;
- how each trainer says each value: `trainers` maps an export target's vocabulary to the knob's
  words there, a table `value -> Say | Refuse` or a function `(value, subject) -> Say | Refuse |
  None`. A value missing from a table is refused, never a KeyError.

A knob's default must be what autofit did before the knob existed: a study written by an older
autofit ran with it, and resumes and exports take the default for every knob the study predates.
Knob modules import torch inside their hooks only: the CLI imports them to validate values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from autofit.errors import ConfigError, shown
from autofit.units import value as text
from autofit.words import Refuse as Refuse  # re-exported: the knobs' vocabulary
from autofit.words import Say as Say
from autofit.words import say as say

if TYPE_CHECKING:
    from autofit.gpus import GpuSpec
    from autofit.models import ModelPreset
    from autofit.run_state import RunState

Reach = Literal["pass", "outside_pass", "step"]  # Knob.reach


@dataclass(frozen=True)
class ProbeContext:
    """What a configuration is checked against before anything runs."""

    knobs: dict[str, Any]
    gpu: GpuSpec
    model: ModelPreset
    backend: str  # simulate | cpu | cuda (auto is resolved by then, or left as auto)


@dataclass(frozen=True)
class Subject:
    """The run a trainer's words describe: every knob's value, the model, and how the run is
    launched (gradient accumulation, the folder its files go to)."""

    config: Mapping[str, Any]
    preset: ModelPreset
    accumulation: int = 1
    out: Path = Path(".")

    @property
    def family(self) -> str:
        return self.preset.family

    @property
    def model(self) -> str:
        return self.preset.name

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])

    def with_value(self, knob: str, value: Any) -> Subject:
        return dataclasses.replace(self, config={**self.config, knob: value})


def _asks_nothing(words: Say | Refuse) -> bool:
    """Words that say nothing at all: what the trainer does when told nothing."""
    return isinstance(words, Say) and not (
        words.settings or words.note or words.warning or words.files
    )


# A table per value, or a function of the value and the run.
Words = Mapping[Any, Say | Refuse] | Callable[[Any, Subject], Say | Refuse | None]


class Knob:
    """One setting. Subclasses set the class attributes and override the hooks they need."""

    name: ClassVar[str]
    default: ClassVar[Any]
    help: ClassVar[str]
    kind: ClassVar[type] = str
    values: ClassVar[Mapping[Any, str] | None] = None  # closed set: value -> what it means
    minimum: ClassVar[int | None] = None
    # What a default of None stands for, in words (the reference pages show it).
    default_means: ClassVar[str] = "none"
    # Whether the value is a path to a file (read when a probe runs): a published row names one
    # relative to calibration/, where the row's facts lie.
    names_a_file: ClassVar[bool] = False
    # Whether the default is also what a trainer does when told nothing: then a trainer without
    # words for this knob runs the default as measured (a batch size is never such a default).
    default_asks_nothing: ClassVar[bool] = True
    # Whether a trainer decides this knob itself when told nothing (how its stack runs: the
    # optimizer's implementation, where text is encoded, its loss), rather than the user's
    # choice of run (a batch, a method): a search with `trainer=` simulates the trainer's own
    # value where autofit's default is one that trainer cannot run as measured
    # (`trainers_own_value`).
    decided_by_trainer: ClassVar[bool] = False
    # Whether the knob changes the memory each extra sample adds (the search shares its estimate
    # of that slope between configurations that differ only in knobs that do not).
    per_sample_memory: ClassVar[bool] = True
    # How far the knob's values reach into the step, which says what the simulator may share
    # between configurations that differ in it:
    # - "pass": the forward and backward pass and nothing else (not the model as built, the
    #   optimizer, its update or what runs after training): a search traces a configuration's
    #   setup and updates once for every value (autofit/fastpath/shared_updates.py);
    # - "outside_pass": not the forward and backward pass (what the update does, what runs after
    #   training, or no tensor at all): a configuration that differs from another only in such
    #   knobs is assembled from the other's pass and its own updates
    #   (autofit/fastpath/first_step.py);
    # - "step": both (the model as built and its pass).
    # `changes_pass_between` and `only_in_the_pass` refine it where a value or the other knobs
    # decide.
    reach: ClassVar[Reach] = "step"
    # The other knobs whose values its rules, words and hooks read (the module docstring).
    depends_on: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()
    after: ClassVar[tuple[str, ...]] = ()
    trainers: ClassVar[Mapping[str, Words]] = {}

    # -- what it is ------------------------------------------------------------------------------

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return tuple(self.values) if self.values is not None else None

    def sample_values(self) -> list[Any]:
        """The values that stand for the knob where each is tried (its contract tests, the
        reference pages' rules): every value of a closed knob; of an open one its default, its
        least value and the next ones (None alone where the default is None: the model's own)."""
        if self.choices is not None:
            return list(self.choices)
        if self.default is None:
            return [None]
        start = self.minimum if self.minimum is not None else self.default
        return sorted({self.default, start, start + 1, self.default + 1})

    def parse(self, value: Any) -> Any:
        """The value as this knob holds it, or a ConfigError naming the value and the valid ones."""
        if value is None and self.default is None:
            return None
        choices = self.choices
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            raise ConfigError(f"{self.name}={shown(value)} is not valid; valid values: true, false")
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"{self.name}={shown(value)} is not valid; expected {self.describe()}"
                )
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(
                    f"{self.name}={shown(value)} is not valid; expected {self.describe()}"
                )
            if choices is not None and value not in choices:
                raise ConfigError(
                    f"{self.name}={shown(value)} is not valid; valid values: {self.describe()}"
                )
            return value
        if isinstance(value, bool) and choices is not None:
            # YAML 1.1 reads on/off as booleans (`ema: [off, gpu]`): take the word back.
            word = "on" if value else "off"
            value = word if word in choices else value
        if choices is not None and value not in choices:
            raise ConfigError(
                f"{self.name}={shown(value)} is not valid; valid values: {', '.join(map(str, choices))}"
            )
        return value

    def libraries(self, value: Any) -> tuple[str, ...]:
        """The modules this knob's hooks import for `value`, on any backend. A run imports them
        before it is built (TrainingRun), because a simulated build runs under fake mode: a
        tensor a module makes as it is imported there would be counted as a GPU allocation of
        the first trace in a process only, and would stay a fake tensor in that module for the
        rest of it. A probe's fresh process leaves out the optional libraries no knob names
        (autofit/probe/libraries.py): one imported but not named here crashes the probe."""
        return ()

    def describe(self) -> str:
        if self.choices is not None:
            return " | ".join(text(c) for c in self.choices)
        if self.kind is int:
            return f"an integer >= {self.minimum}" if self.minimum is not None else "an integer"
        if self.kind is bool:
            return "true | false"
        return self.kind.__name__

    def changes_pass_between(self, one: Any, other: Any) -> bool:
        """Whether runs that differ only in this knob's values `one` and `other` run different
        forward and backward passes (its `reach`, unless a value changes it alone)."""
        return self.reach != "outside_pass"

    def means(self, value: Any, subject: Subject) -> str:
        """What the value asks of one's own training code, in a phrase."""
        assert self.values is not None, f"knob {self.name} must say what its values mean"
        return self.values[value]

    def only_in_the_pass(self, knobs: Mapping[str, Any]) -> bool:
        """Whether, in the configuration `knobs`, this knob changes nothing but the pass."""
        return self.reach == "pass"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        """Whether the value matters in this configuration (a LoRA rank without LoRA does not)."""
        return True

    # -- what it saves (the search) --------------------------------------------------------------

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        """If `value` only saves memory, at a speed cost, the value it saves over (one of
        `searched`, the values the search tries, where that matters); else None. The search
        needs such a value only at batches the faster one cannot fit."""
        return None

    # -- its rules -------------------------------------------------------------------------------

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        """Why this value cannot run in this context, or None. Decided without torch."""
        return None

    def needless_without_trainer(self, value: Any, searched: tuple[Any, ...]) -> str | None:
        """Why a search that launches no particular trainer leaves `value` out when it also tries
        the values in `searched` (another does the same in less memory, no slower), or None."""
        return None

    def needless_on(self, value: Any, searched: tuple[Any, ...], gpu: GpuSpec) -> str | None:
        """Why a search for `gpu` leaves `value` out when it also tries the values in `searched`
        (another does the same there, at no cost the user would choose), or None."""
        return None

    # -- how it is applied -----------------------------------------------------------------------

    def prepare(self, run: RunState, value: Any) -> None:
        """Before the model exists (decide the dtypes it is built in)."""

    def build_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        """Entered while the model is constructed (build it on the host, partitioned, ...)."""
        return None

    def apply(self, run: RunState, value: Any) -> None:
        """Once the model exists (wrap it, build the optimizer, add companions, ...)."""

    def forward_context(self, run: RunState, value: Any) -> AbstractContextManager[Any] | None:
        """Entered around every forward pass (autocast, an attention kernel)."""
        return None

    def after_training(self, run: RunState, value: Any) -> None:
        """After the training steps, with the training state still resident (a validation)."""

    # -- how trainers say it ---------------------------------------------------------------------

    def words(self, vocabulary: str, value: Any, subject: Subject) -> Say | Refuse | None:
        """The knob's own words for `value` in `vocabulary`, or None where it declares none."""
        entry = self.trainers.get(vocabulary)
        if entry is None:
            return None
        if callable(entry):
            return entry(value, subject)
        if value in entry:
            return entry[value]
        return Refuse(f"autofit knows no {vocabulary} setting for {self.name}={text(value)}")

    def express(
        self, vocabulary: str, value: Any, subject: Subject, own_code: bool = False
    ) -> Say | Refuse:
        """How a trainer expresses `value`: its words where the knob declares them; nothing to
        say where the value does not matter here or is a default that asks nothing; for a target
        that configures one's own training code (`own_code`), a note of what that code must do;
        otherwise a refusal: the trainer has no setting for it."""
        if not self.applies(subject.config, subject.preset):
            return Say()
        words = self.words(vocabulary, value, subject)
        if words is not None:
            return words
        if value == self.default and self.default_asks_nothing:
            return Say()
        if own_code:
            return Say(note=f"{self.name}={text(value)}: {self.means(value, subject)}")
        return Refuse(
            f"{vocabulary} has no setting for {self.name}",
            offers="" if self.choices else f"{self.name}={text(self.default)}",
        )

    def runs(self, vocabulary: str, subject: Subject, own_code: bool = False) -> tuple[Any, ...]:
        """The values of this knob a trainer runs, given the rest of `subject`, in the knob's
        order; () where the set is open (no `choices`)."""
        if self.choices is None:
            return ()
        return tuple(
            v
            for v in self.choices
            if isinstance(
                self.express(vocabulary, v, subject.with_value(self.name, v), own_code), Say
            )
        )

    def offers(self, vocabulary: str, subject: Subject, own_code: bool = False) -> str:
        """What a trainer can run of this knob, given the rest of `subject`: its values, or where
        the set is open, '' (the refusal says)."""
        if self.choices is None:
            return ""
        fine = self.runs(vocabulary, subject, own_code)
        if not fine:
            return f"no value of {self.name} with the rest of this run"
        return f"{self.name}=" + ", ".join(text(v) for v in fine)

    def trainers_own_value(
        self, vocabulary: str, subject: Subject, own_code: bool = False
    ) -> Any | None:
        """The value a trainer runs when told nothing, where this knob is one the trainer decides
        and autofit's default is not something it runs as measured (it refuses it, or runs it with
        a warning): the first value its words express by asking nothing. None otherwise."""
        if not self.decided_by_trainer or self.choices is None:
            return None
        if not self.applies(subject.config, subject.preset):
            return None
        said = self.express(vocabulary, self.default, subject, own_code)
        if isinstance(said, Say) and not said.warning:
            return None
        for value in self.choices:
            other = subject.with_value(self.name, value)
            if value != self.default and _asks_nothing(
                self.express(vocabulary, value, other, own_code)
            ):
                return value
        return None
