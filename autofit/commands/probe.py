"""`autofit probe`: measure one configuration, print a summary, write the result JSON."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.paths import ensure_writable
from autofit.probe.build import spec_from_config
from autofit.probe.runner import run_probe
from autofit.probe.spec import Outcome, ProbeSpec
from autofit.probe.summary import summarize

# Not fitting (oom, oom_host) and not being able to run here at all (invalid) are answers; a
# probe that crashed or timed out is a failure of the run, and scripts should hear about it.
ANSWERED = (Outcome.OK, Outcome.OOM, Outcome.OOM_HOST, Outcome.INVALID)


def default_output(spec: ProbeSpec) -> Path:
    knobs = spec.knobs
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{spec.model['name']}-{spec.gpu['name']}-b{knobs['batch_size']}-r{knobs['resolution']}-{stamp}"
    return Path("results") / "probes" / f"{name}.json"


def run(overrides: list[str]) -> int:
    return run_config(compose_config("probe", overrides))


def run_config(cfg: Any) -> int:
    """Probe the configuration a composed `probe` config describes."""
    spec = spec_from_config(cfg)
    out = Path(cfg.out) if cfg.out else default_output(spec)
    ensure_writable(out)
    result = run_probe(spec)
    result.write(out)
    print(summarize(result))
    print(f"  result     {out}")
    return 0 if result.outcome in ANSWERED else 1
