"""Every knob, declared once (autofit/knobs/base.py says what a knob declares).

`REGISTRY` lists the knobs in the order the CLI, spaces and tables show them: what a workload is
trained on first, then the techniques. Their hooks run in `application_order()`: owners of a run
field before the knobs that read it, and each knob after the ones it names in `after`; knobs no
constraint orders keep the registry's order. Nothing here imports torch.

Adding a knob: a module here with its `Knob` subclass, and its line in `REGISTRY`. Its tests come
with it: the contract tests (tests/contracts/test_knob_contract.py) run every value of every knob through
the rules, every export target and stored studies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autofit.errors import ConfigError, suggest
from autofit.gpus import GpuSpec
from autofit.knobs.adapter_dtype import AdapterDtype
from autofit.knobs.allocator import Allocator
from autofit.knobs.attention import Attention
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject
from autofit.knobs.base_precision import BasePrecision
from autofit.knobs.batch_size import BatchSize
from autofit.knobs.checkpoint_interval import CheckpointInterval
from autofit.knobs.checkpoint_policy import CheckpointPolicy
from autofit.knobs.checkpoint_stride import CheckpointStride
from autofit.knobs.checkpointing import Checkpointing
from autofit.knobs.compile import Compile
from autofit.knobs.ema import Ema
from autofit.knobs.encoders import Encoders
from autofit.knobs.frames import Frames
from autofit.knobs.fsdp import Fsdp
from autofit.knobs.fsdp_offload import FsdpOffload
from autofit.knobs.fsdp_version import FsdpVersion
from autofit.knobs.fused_backward import FusedBackward
from autofit.knobs.kbit_prep import KbitPrep
from autofit.knobs.lora_rank import LoraRank
from autofit.knobs.lora_targets import LoraTargets
from autofit.knobs.loss import Loss
from autofit.knobs.lycoris_config import LycorisConfigKnob
from autofit.knobs.offload_activations import OffloadActivations
from autofit.knobs.offload_optimizer import OffloadOptimizer
from autofit.knobs.offload_params import OffloadParams
from autofit.knobs.optimizer import Optimizer
from autofit.knobs.optimizer_impl import OptimizerImpl
from autofit.knobs.peft_config import PeftConfigKnob
from autofit.knobs.precision import Precision
from autofit.knobs.resolution import Resolution
from autofit.knobs.swap_blocks import SwapBlocks
from autofit.knobs.t5_precision import T5Precision
from autofit.knobs.train_mode import TrainMode
from autofit.knobs.trainable_layers import TrainableLayers
from autofit.knobs.validation import Validation
from autofit.knobs.validation_resolution import ValidationResolution
from autofit.knobs.world_size import WorldSize
from autofit.knobs.zero3_params import ZERO3_SETTINGS
from autofit.knobs.zero_stage import ZeroStage
from autofit.models import ModelPreset


def by_name(knobs: Sequence[Knob]) -> dict[str, Knob]:
    """The knobs keyed by name, in their order. Two knobs of one name is a bug: the second would
    silently replace the first."""
    table: dict[str, Knob] = {}
    for knob in knobs:
        assert knob.name not in table, f"two knobs are named {knob.name}"
        table[knob.name] = knob
    return table


REGISTRY: dict[str, Knob] = by_name(
    (
        BatchSize(),
        Resolution(),
        Frames(),
        Precision(),
        TrainMode(),
        KbitPrep(),
        TrainableLayers(),
        BasePrecision(),
        LoraRank(),
        LoraTargets(),
        PeftConfigKnob(),
        AdapterDtype(),
        LycorisConfigKnob(),
        Checkpointing(),
        CheckpointInterval(),
        CheckpointStride(),
        CheckpointPolicy(),
        Attention(),
        Compile(),
        Loss(),
        Encoders(),
        T5Precision(),
        SwapBlocks(),
        Optimizer(),
        OptimizerImpl(),
        FusedBackward(),
        ZeroStage(),
        OffloadOptimizer(),
        OffloadParams(),
        *ZERO3_SETTINGS,
        OffloadActivations(),
        Fsdp(),
        FsdpOffload(),
        FsdpVersion(),
        WorldSize(),
        Ema(),
        Validation(),
        ValidationResolution(),
        Allocator(),
    )
)
WORKLOAD_KNOBS = ("batch_size", "resolution")  # what is trained on; the others are techniques


def registry() -> dict[str, Knob]:
    """Every knob by name, in the registry's order."""
    return REGISTRY


def defaults() -> dict[str, Any]:
    """Every knob's default: what a run is when told nothing, and what a study predating a knob
    ran with."""
    return {name: knob.default for name, knob in REGISTRY.items()}


def completed(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored configuration with every knob: those it predates at their defaults (what it ran
    with), in its own order first; knobs this autofit does not know are kept, for the caller to
    judge."""
    return {**config, **{k: v for k, v in defaults().items() if k not in config}}


def asked(config: Mapping[str, Any], preset: ModelPreset) -> dict[str, Any]:
    """The knobs of a configuration that ask something of the run that launches it: those that
    matter here and are not at a default that asks nothing. An export lists these; every other
    knob is at its default, as a trainer told nothing runs it."""
    return {
        name: value
        for name, value in config.items()
        if name not in REGISTRY
        or (
            REGISTRY[name].applies(config, preset)
            and not (value == REGISTRY[name].default and REGISTRY[name].default_asks_nothing)
        )
    }


def that_matter(config: Mapping[str, Any], preset: ModelPreset) -> dict[str, Any]:
    """The knobs of a configuration that matter for it (a LoRA rank does not in a full
    fine-tune), defaults included: what best.yaml lists; the rest run at any value alike."""
    return {
        name: value
        for name, value in config.items()
        if name not in REGISTRY or REGISTRY[name].applies(config, preset)
    }


def parse_all(values: Mapping[str, Any], knobs: Sequence[Knob] | None = None) -> dict[str, Any]:
    """Validate every knob's value, filling defaults; the first bad value raises ConfigError."""
    table = {k.name: k for k in knobs} if knobs is not None else REGISTRY
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise ConfigError(
            f"unknown knob '{unknown[0]}'{suggest(unknown[0], list(table))}; valid knobs: "
            f"{', '.join(table)}"
        )
    return {name: knob.parse(values.get(name, knob.default)) for name, knob in table.items()}


def owners(knobs: Mapping[str, Knob] | None = None) -> dict[str, str]:
    """Each run field a knob owns, with its owner. Two owners of one field is a bug."""
    found: dict[str, str] = {}
    for knob in (knobs or REGISTRY).values():
        for field in knob.writes:
            assert field not in found, f"run.{field} has two owners: {found[field]}, {knob.name}"
            found[field] = knob.name
    return found


def application_order(knobs: Mapping[str, Knob] | None = None) -> list[Knob]:
    """The knobs in the order their hooks run: every field's owner before its readers, every
    knob after those it names in `after`, otherwise the registry's order."""
    table = knobs or REGISTRY
    owner = owners(table)
    before: dict[str, set[str]] = {name: set() for name in table}
    for knob in table.values():
        for field in knob.reads:
            assert field in owner, f"knob {knob.name} reads run.{field}, which no knob writes"
            if owner[field] != knob.name:
                before[knob.name].add(owner[field])
        for name in knob.after:
            assert name in table, f"knob {knob.name} comes after {name}, which is no knob"
            before[knob.name].add(name)
    order: list[Knob] = []
    placed: set[str] = set()
    while len(order) < len(table):
        ready = [n for n in table if n not in placed and before[n] <= placed]
        if not ready:
            waiting = sorted(n for n in table if n not in placed)
            raise AssertionError(
                f"the knobs' order constraints form a cycle among {', '.join(waiting)}"
            )
        order.append(table[ready[0]])
        placed.add(ready[0])
    return order


def invalid_reason(
    knobs: Mapping[str, Any], gpu: GpuSpec, model: ModelPreset, backend: str
) -> str | None:
    """The first knob's reason this configuration cannot run, or None (no torch needed)."""
    context = ProbeContext(dict(knobs), gpu, model, backend)
    for name, knob in REGISTRY.items():
        reason = knob.invalid_reason(knobs[name], context)
        if reason:
            return reason
    return None


__all__ = [
    "REGISTRY",
    "WORKLOAD_KNOBS",
    "Knob",
    "ProbeContext",
    "Refuse",
    "Say",
    "Subject",
    "application_order",
    "asked",
    "completed",
    "defaults",
    "invalid_reason",
    "owners",
    "parse_all",
    "registry",
]
