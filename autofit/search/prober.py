"""Run a probe, or answer from the study when the same probe already finished there (or is
running in another worker: `Busy` says to come back)."""

from __future__ import annotations

from typing import Any

from autofit.gpus import GpuSpec
from autofit.knobs import registry
from autofit.models import ModelPreset
from autofit.probe.build import make_spec
from autofit.probe.launcher import Launcher
from autofit.probe.runner import run_probe
from autofit.probe.spec import ProbeResult
from autofit.search.recorder import StudyRecorder, probe_key


class Prober:
    """Probes `preset` on `gpu` with the given knobs (the rest at their defaults), through
    `launcher`, and records each new result in the study the moment it finishes."""

    def __init__(
        self,
        preset: ModelPreset,
        gpu: GpuSpec,
        backend: str,
        margin: float,
        timeout_s: float,
        recorder: StudyRecorder,
        launcher: Launcher,
        host_memory_bytes: int | None = None,
    ) -> None:
        self.preset, self.gpu, self.backend = preset, gpu, backend
        self.margin, self.timeout_s = margin, timeout_s
        self.host_budget = host_memory_bytes  # None: no host limit
        self.recorder, self.launcher = recorder, launcher
        self.budget = gpu.budget_bytes(margin)
        self.fingerprints = (preset.fingerprint(), gpu.fingerprint())  # the same for every probe
        # every knob's default: the engine checks combinations with them filled in
        self.defaults = {name: knob.default for name, knob in registry().items()}

    def __call__(self, knobs: dict[str, Any]) -> tuple[ProbeResult, bool]:
        """The result for these knob values, and whether it was reused from the study."""
        # make_spec fills every knob left out with its default
        spec = make_spec(
            self.preset, self.gpu, knobs, self.backend, self.margin, self.timeout_s,
            self.host_budget,
        )  # fmt: skip
        key = probe_key(spec.knobs, self.backend, self.budget, *self.fingerprints, self.host_budget)
        result = self.recorder.finished(key)
        if result is not None:
            return result, True
        claim = self.recorder.claim(key, spec.knobs, self.timeout_s)  # raises Busy: come back
        if claim is None:  # another worker recorded it while this one looked
            result = self.recorder.finished(key)
            assert result is not None
            return result, True
        try:
            result = run_probe(spec, launcher=self.launcher)
        except BaseException:
            # The probe did not finish because autofit is stopping (or its probe server died):
            # no answer for this configuration. Give the claim back for another worker or run.
            claim.release()
            raise
        claim.record(result)
        return result, False
