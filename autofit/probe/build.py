"""Turn a composed configuration into a `ProbeSpec`, validating everything a probe will use."""

from __future__ import annotations

from typing import Any

from autofit.backends import BACKENDS, resolve
from autofit.calibration.margins import ChosenMargin, chosen_margin, run_class
from autofit.errors import ConfigError, shown
from autofit.families import check_family
from autofit.gpus import GpuSpec
from autofit.host import check_host_memory, host_budget_bytes
from autofit.knobs import parse_all, registry
from autofit.models import ModelPreset
from autofit.records.probe import DEFAULT_MARGIN, ProbeSpec


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
    if backend not in ("auto", *BACKENDS):
        raise ConfigError(
            f"backend={shown(backend)} is not valid; valid values: auto, {', '.join(BACKENDS)}"
        )
    if margin != "auto" and (
        isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1
    ):
        raise ConfigError(
            f"margin={shown(margin)} is not valid; expected auto or a fraction in [0, 1), e.g. 0.05"
        )
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ConfigError(
            f"timeout_s={shown(timeout_s)} is not valid; expected a number of seconds > 0"
        )


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
    native one when unset and checked against the model's granularity). `host_memory_bytes`:
    the host budget, resolved (see `host_budget`); None: no host limit."""
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
    return ProbeSpec(
        model=preset.to_dict(),
        gpu=gpu.to_dict(),
        knobs=knobs,
        backend=backend,
        margin=float(margin),
        timeout_s=float(timeout_s),
        host_memory_bytes=host_memory_bytes,
    )


def host_budget(setting: Any, backend: str, gpu: GpuSpec, margin: float) -> int | None:
    """The host budget of `host_memory_gib=` (checked: a one-line error if it is not a positive
    number): as set, else this machine's RAM when the probe runs on the local GPU (backend
    `cuda`, or `auto` finding a GPU large enough here), else the RAM of a typical machine for
    the card (its entry's `host_memory_gib`), else None."""
    gib = check_host_memory(setting)
    if gib is None and backend != "simulate" and backend != "cpu":
        backend = resolve(backend, gpu, gpu.budget_bytes(margin))
    return host_budget_bytes(gib, backend, gpu)


def spec_from_config(cfg: Any) -> ProbeSpec:
    """The spec `autofit probe` measures, from its composed configuration."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    knob_values = {name: data[name] for name in registry()}
    gpu = gpu_from_config(data["gpu"])
    check_settings(data["backend"], data["margin"], data["timeout_s"])
    preset = preset_from_config(data["model"])
    margin = probe_margin(data["margin"], preset, knob_values).value
    return make_spec(
        preset,
        gpu,
        knob_values,
        backend=data["backend"],
        margin=margin,
        timeout_s=data["timeout_s"],
        host_memory_bytes=host_budget(data.get("host_memory_gib"), data["backend"], gpu, margin),
    )


def probe_margin(setting: Any, preset: ModelPreset, knob_values: dict[str, Any]) -> ChosenMargin:
    """The margin of one run: as set, or (`auto`) its class's (autofit/calibration/margins.py)."""
    return chosen_margin(setting, preset.family, [run_class(preset.family, knob_values)])
