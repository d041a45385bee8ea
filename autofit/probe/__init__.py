"""Probes: one training configuration measured in its own subprocess."""

from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec

__all__ = ["Outcome", "ProbeResult", "ProbeSpec", "run_probe"]
