"""A `ProbeSpec` from a model, a card and knob values, everything a probe will use checked; and
the rules of the settings every command that probes takes."""

from __future__ import annotations

from typing import Any

from autofit.backends import BACKENDS, resolve
from autofit.calibration.margins import ChosenMargin, chosen_margin, run_class
from autofit.errors import ConfigError, shown
from autofit.families import REGISTRY as FAMILIES
from autofit.families import check_family
from autofit.gpus import GpuSpec
from autofit.knobs import parse_all
from autofit.knobs.frames import native_frames
from autofit.models import ModelPreset
from autofit.records.probe import DEFAULT_MARGIN, ProbeSpec
from autofit.settings import Rule, choice, is_number, number

# The rules of the settings every command that probes takes (autofit/settings.py).
BACKEND = choice("auto", *BACKENDS)
MARGIN = Rule(
    lambda v: v == "auto" or (is_number(v) and 0 <= v < 1),
    "expected auto or a fraction in [0, 1), e.g. 0.05",
    convert=lambda v: v if v == "auto" else float(v),
)
TIMEOUT_S = number(lambda v: v > 0, "expected a number of seconds > 0")


def preset_from_config(data: dict[str, Any]) -> ModelPreset:
    """The composed `model` entry (a preset, fields overridden or not), checked field by field
    (ModelPreset.from_dict) and its family known (`model.family=` may name any)."""
    preset = ModelPreset.from_dict(data)
    check_family(preset.family)
    return preset


def gpu_from_config(data: dict[str, Any]) -> GpuSpec:
    """The composed `gpu` entry (shipped or the user's file, fields overridden or not), checked
    field by field."""
    return GpuSpec.from_dict(data, source=f"gpu {data.get('name', '?')}")


def check_settings(backend: str, margin: float, timeout_s: float) -> None:
    """The settings of a spec made in code (`make_spec`), checked by the rules a command's are."""
    BACKEND("backend", backend)
    MARGIN("margin", margin)
    TIMEOUT_S("timeout_s", timeout_s)


def check_custom(preset: ModelPreset, timeout_s: float) -> None:
    """A custom model's entry function, called in a child process under `timeout_s` and checked
    (autofit/probe/entry_check.py), once per process; nothing for a preset."""
    if preset.family == "custom":
        # lazy: keeps torch out of the search's own process (the entry check imports it)
        from autofit.probe.entry_check import check_entry_builds

        check_entry_builds(preset.entry, timeout_s)


def make_spec(
    preset: ModelPreset,
    gpu: GpuSpec,
    knob_values: dict[str, Any],
    backend: str = "auto",
    margin: float = DEFAULT_MARGIN,
    timeout_s: float = 900.0,
    host_memory_bytes: int | None = None,
) -> ProbeSpec:
    """A validated spec: every knob parsed (defaults filled, resolution resolved to the model's
    native one when unset and checked against the model's granularity, a video model's clip
    length likewise). `host_memory_bytes`: the host budget, resolved (see `host_budget`); None:
    no host limit."""
    check_settings(backend, margin, timeout_s)
    if host_memory_bytes is not None and (
        isinstance(host_memory_bytes, bool)
        or not isinstance(host_memory_bytes, int)
        or host_memory_bytes <= 0
    ):
        raise ConfigError(
            f"host_memory_bytes={shown(host_memory_bytes)} is not valid; expected bytes > 0 or None"
        )
    # A reservation that leaves nothing fails here, not in the worker.
    budget = gpu.budget_bytes(margin)
    if backend == "cuda":  # where CUDA cannot run: one line here, not a crash in every worker
        resolve(backend, gpu, budget)
    check_custom(preset, timeout_s)
    knobs = parse_all(knob_values)
    if knobs["resolution"] is None:
        knobs["resolution"] = preset.resolution
    preset.check_resolution(knobs["resolution"])
    if knobs["frames"] is None and FAMILIES[preset.family].video:
        knobs["frames"] = native_frames(preset)  # a probe's record says the clip it trained
    return ProbeSpec(
        model=preset.to_dict(),
        gpu=gpu.to_dict(),
        knobs=knobs,
        backend=backend,
        margin=float(margin),
        timeout_s=float(timeout_s),
        host_memory_bytes=host_memory_bytes,
    )


def probe_margin(setting: Any, preset: ModelPreset, knob_values: dict[str, Any]) -> ChosenMargin:
    """The margin of one run: as set, or (`auto`) its class's (autofit/calibration/margins.py)."""
    return chosen_margin(setting, preset.family, [run_class(preset.family, knob_values)])
