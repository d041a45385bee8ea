"""`autofit probe`: measure one configuration, print a summary, write the result JSON.

The probe's worker is forked from a fork server (autofit/probe/launcher.py) started before the
configuration is composed: its imports (torch, seconds) run on the machine's other core while
Hydra composes (half a second), and the worker starts with no interpreter of its own to start.
A probe on CUDA, whose context a fork would break, is spawned as before; the server is then
discarded at once, as it is after a configuration error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from autofit.backends import resolve
from autofit.config import compose_config
from autofit.host import HOST_MEMORY_GIB, budget_words, host_budget, host_budget_basis
from autofit.knobs import parse_all, registry
from autofit.paths import ensure_writable
from autofit.probe.build import (
    BACKEND,
    MARGIN,
    TIMEOUT_S,
    gpu_from_config,
    make_spec,
    preset_from_config,
    probe_margin,
)
from autofit.probe.launcher import ForkServer
from autofit.probe.runner import WORKER, run_probe
from autofit.probe.summary import summarize
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec
from autofit.settings import TEXT, Rule, built, entry, plain, setting

# Every knob's value, each checked by its knob (autofit/knobs/), its default filled in.
KNOBS = Rule(lambda v: isinstance(v, Mapping), "expected a mapping", convert=parse_all)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    """`autofit probe`'s settings, each with its rule; conf/probe.yaml gives the defaults and says
    what each means. `knobs` holds the knobs' values (set at the config's top level)."""

    model: dict[str, Any] = entry()
    gpu: dict[str, Any] = entry()
    backend: str = setting("auto", BACKEND)
    margin: float | str = setting("auto", MARGIN)
    host_memory_gib: float | None = setting(None, HOST_MEMORY_GIB)
    timeout_s: float = setting(900.0, TIMEOUT_S)
    out: str | None = setting(None, TEXT.or_null())
    knobs: dict[str, Any] = setting(None, KNOBS)


def probe_settings(cfg: Any) -> ProbeSettings:
    """The settings of a composed `probe` config, every one checked."""
    composed = plain(cfg)
    return built(ProbeSettings, {**composed, "knobs": {k: composed[k] for k in registry()}})


# Not fitting (oom, oom_host) and not being able to run here at all (invalid) are answers; a
# probe that crashed or timed out is a failure of the run, and scripts should hear about it.
ANSWERED = (Outcome.OK, Outcome.OOM, Outcome.OOM_HOST, Outcome.INVALID)


def default_output(spec: ProbeSpec) -> Path:
    knobs = spec.knobs
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{spec.model['name']}-{spec.gpu['name']}-b{knobs['batch_size']}-r{knobs['resolution']}-{stamp}"
    return Path("results") / "probes" / f"{name}.json"


# What the worker of a CPU backend imports before it reads its spec; the model family's library
# comes after the fork, once the spec names it.
PRELOAD = [WORKER, "autofit.backends.simulate"]


@contextlib.contextmanager
def _warm_server() -> Iterator[ForkServer]:
    """A fork server importing PRELOAD from now on; discarded when the block ends."""
    server = ForkServer(PRELOAD)
    server.warm()
    try:
        yield server
    finally:
        server.discard()


def _runs_on_cpu(spec: ProbeSpec) -> bool:
    """Whether the probe's backend keeps to the CPU (`auto` resolved as the worker resolves it:
    `cuda` when a large enough GPU is here), and so may be forked."""
    if spec.backend in ("simulate", "cpu"):
        return True
    return resolve(spec.backend, spec.gpu_spec, spec.budget_bytes) != "cuda"


def run(overrides: list[str]) -> int:
    with _warm_server() as server:
        return run_config(compose_config("probe", overrides), server)


def run_config(cfg: Any, server: ForkServer | None = None) -> int:
    """Probe the configuration a composed `probe` config describes; forked from `server` (a
    warm fork server) when given and the probe runs on the CPU, else spawned."""
    return probe(probe_settings(cfg), server)


def spec_of(settings: ProbeSettings) -> ProbeSpec:
    """The spec `autofit probe` measures: the model and card read, the margin (auto: its run
    class's) and the host budget (unset: as `host_budget` finds it) chosen."""
    gpu, preset = gpu_from_config(settings.gpu), preset_from_config(settings.model)
    margin = probe_margin(settings.margin, preset, settings.knobs).value
    backend = settings.backend
    if settings.host_memory_gib is None and backend not in ("simulate", "cpu"):
        backend = resolve(backend, gpu, gpu.budget_bytes(margin))  # this machine's RAM on cuda
    return make_spec(
        preset, gpu, settings.knobs, backend=settings.backend, margin=margin,
        timeout_s=settings.timeout_s,
        host_memory_bytes=host_budget(settings.host_memory_gib, backend, gpu)[0],
    )  # fmt: skip


def probe(settings: ProbeSettings, server: ForkServer | None = None) -> int:
    """The probe `settings` describe, its result written and summed up."""
    spec = spec_of(settings)
    out = Path(settings.out) if settings.out else default_output(spec)
    ensure_writable(out)
    if server is not None and not _runs_on_cpu(spec):
        server.discard()  # its imports would only compete with the spawned worker's
        server = None
    result = run_probe(spec, launcher=server)
    result.write(out)
    _render(settings, spec, result, out)
    return 0 if result.outcome in ANSWERED else 1


def _render(settings: ProbeSettings, spec: ProbeSpec, result: ProbeResult, out: Path) -> None:
    print(summarize(result))
    margin = probe_margin(settings.margin, preset_from_config(spec.model), spec.knobs)
    print(f"  margin     {margin.words()}")
    if spec.host_memory_bytes is not None:
        basis = host_budget_basis(settings.host_memory_gib, result.backend, spec.gpu_spec)
        print(f"  host RAM   {budget_words(spec.host_memory_bytes, basis)}")
    print(f"  result     {out}")
