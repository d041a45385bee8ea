"""`autofit probe`: measure one configuration, print a summary, write the result JSON.

The probe's worker is forked from a fork server (autofit/probe/launcher.py) started before the
configuration is composed: its imports (torch, seconds) run on the machine's other core while
Hydra composes (half a second), and the worker starts with no interpreter of its own to start.
A probe on CUDA, whose context a fork would break, is spawned as before; the server is then
discarded at once, as it is after a configuration error.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.host import budget_words, check_host_memory, host_budget_basis
from autofit.models import ModelPreset
from autofit.paths import ensure_writable
from autofit.probe.build import probe_margin, spec_from_config
from autofit.probe.launcher import ForkServer
from autofit.probe.runner import WORKER, run_probe
from autofit.probe.summary import summarize
from autofit.records.probe import Outcome, ProbeSpec

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
    from autofit.backends import resolve

    return resolve(spec.backend, spec.gpu_spec, spec.budget_bytes) != "cuda"


def run(overrides: list[str]) -> int:
    with _warm_server() as server:
        return run_config(compose_config("probe", overrides), server)


def run_config(cfg: Any, server: ForkServer | None = None) -> int:
    """Probe the configuration a composed `probe` config describes; forked from `server` (a
    warm fork server) when given and the probe runs on the CPU, else spawned."""
    spec = spec_from_config(cfg)
    out = Path(cfg.out) if cfg.out else default_output(spec)
    ensure_writable(out)
    if server is not None and not _runs_on_cpu(spec):
        server.discard()  # its imports would only compete with the spawned worker's
        server = None
    result = run_probe(spec, launcher=server)
    result.write(out)
    print(summarize(result))
    margin = probe_margin(cfg.margin, ModelPreset.from_dict(spec.model), spec.knobs)
    print(f"  margin     {margin.words()}")
    if spec.host_memory_bytes is not None:
        setting = check_host_memory(cfg.get("host_memory_gib"))
        basis = host_budget_basis(setting, result.backend, spec.gpu_spec)
        print(f"  host RAM   {budget_words(spec.host_memory_bytes, basis)}")
    print(f"  result     {out}")
    return 0 if result.outcome in ANSWERED else 1
