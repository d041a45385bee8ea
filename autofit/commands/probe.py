"""`autofit probe`: measure one configuration, print a summary, write the result JSON."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError
from autofit.probe.build import spec_from_config
from autofit.probe.runner import run_probe
from autofit.probe.spec import Outcome, ProbeSpec
from autofit.probe.summary import summarize

# Not fitting (oom) and not being able to run here at all (invalid) are answers; a probe that
# crashed or timed out is a failure of the run, and scripts should hear about it.
ANSWERED = (Outcome.OK, Outcome.OOM, Outcome.INVALID)


def default_output(spec: ProbeSpec) -> Path:
    knobs = spec.knobs
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{spec.model['name']}-{spec.gpu['name']}-b{knobs['batch_size']}-r{knobs['resolution']}-{stamp}"
    return Path("results") / "probes" / f"{name}.json"


def ensure_writable(path: Path) -> None:
    """Fail before the probe, not after it: a result that cannot be written would be lost."""
    blocker = next((p for p in [*reversed(path.parents)] if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise AutofitError(f"cannot write the result to {path}: {blocker} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AutofitError(f"cannot write the result to {path}: {exc.strerror}") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise AutofitError(f"cannot write the result to {path}: not a writable file path")


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
