"""Run a probe, or answer from the study when the same probe already finished there (or is
running in another worker: `Busy` says to come back)."""

from __future__ import annotations

from typing import Any

from autofit.fastpath.scans import SCAN_TRACES, run_scans
from autofit.fastpath.update_keys import search_directory
from autofit.gpus import GpuSpec
from autofit.knobs import registry
from autofit.models import ModelPreset
from autofit.probe.build import make_spec
from autofit.probe.launcher import Launcher
from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec, ScanResult, ScanWindow
from autofit.search.claims import Busy
from autofit.search.keys import probe_key, scan_key
from autofit.search.recorder import Claim, StudyRecorder


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
        scan: bool = True,
    ) -> None:
        """`scan`: answer simulated structures from batch curves (`scan`); False probes them
        batch by batch as a real backend is (benchmarks/search_cost.py compares the two)."""
        self.preset, self.gpu, self.backend = preset, gpu, backend
        self.margin, self.timeout_s = margin, timeout_s
        self.host_budget = host_memory_bytes  # None: no host limit
        self.recorder, self.launcher = recorder, launcher
        self._scan = scan
        self.budget = gpu.budget_bytes(margin)
        self.fingerprints = (preset.fingerprint(), gpu.fingerprint())  # the same for every probe
        # every knob's default: the engine checks combinations with them filled in
        self.defaults = {name: knob.default for name, knob in registry().items()}
        # the setup and updates its scans trace, shared between them (removed by `close`, or
        # with the prober)
        self.updates_dir, self._remove_updates = (
            search_directory(self) if self.scans else (None, lambda: None)
        )

    def close(self) -> None:
        """Remove what the prober keeps for its scans (a search that is interrupted ends its
        process without the interpreter's teardown, so it must be said)."""
        self._remove_updates()

    def warm(self) -> None:
        """Get the launcher ready for the first probe (Launcher.warm) while the caller works."""
        self.launcher.warm()

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

    @property
    def scans(self) -> bool:
        """Whether this prober answers a structure for every batch at once (`scan`): simulated
        probes can (autofit/fastpath/batch_curve.py); real ones measure batch by batch."""
        return self._scan and self.backend == "simulate"

    def scan(
        self,
        structures: list[tuple[dict[str, Any], int]],
        hi: int,
        window: ScanWindow | None = None,
    ) -> list[tuple[ScanResult, bool] | None]:
        """For each structure (its knobs, batch size aside, and the smallest batch `lo` of its
        range): the largest batch in `lo`..`hi` that fits, and whether it came from the study;
        None where another worker is scanning it (come back later). Those not in the study are
        scanned together in one subprocess, which lends the first one's curve to the others
        where their steps agree (autofit/fastpath/scan.py).

        `window`: each also reports the batches in it (ScanWindow), for the best rule
        (autofit/search/pareto.py BestRule).

        The study keeps a scan as the trial of its first reported point (the best batch, or `lo`
        failing) under the scan's key, with the batches of the others and the window's floor;
        each other point (the batch above the best, those in the window) is a trial of its own
        under its probe key."""
        fingerprints = (self.backend, self.budget, *self.fingerprints, self.host_budget)
        answers: list[tuple[ScanResult, bool] | None] = []
        todo: list[tuple[int, ProbeSpec, int, Claim]] = []
        for knobs, lo in structures:
            spec = make_spec(
                self.preset, self.gpu, {**knobs, "batch_size": lo}, self.backend, self.margin,
                self.timeout_s, self.host_budget,
            )  # fmt: skip
            key = scan_key(spec.knobs, lo, hi, *fingerprints, window=window)
            stored = self.recorder.finished(key)
            claim = None
            if stored is None:
                structure = {k: v for k, v in spec.knobs.items() if k != "batch_size"}
                timeout_s = SCAN_TRACES * len(structures) * self.timeout_s  # as run_scans allows
                try:
                    claim = self.recorder.claim(key, structure, timeout_s)
                except Busy:
                    answers.append(None)
                    continue
                if claim is None:
                    stored = self.recorder.finished(key)
            if stored is not None:
                stored_scan = _stored_scan(
                    self, stored, lo, hi, fingerprints, *self.recorder.reported(key)
                )
                answers.append((stored_scan, True))
                continue
            assert claim is not None
            todo.append((len(answers), spec, lo, claim))
            answers.append(None)
        if not todo:
            return answers
        try:
            scanned = run_scans(
                [(spec, lo) for _, spec, lo, _ in todo],
                hi,
                self.launcher,
                window,
                self.updates_dir,
            )
        except BaseException:
            for *_, claim in todo:
                claim.release()
            raise
        for (place, _, _, claim), answer in zip(todo, scanned, strict=True):
            answers[place] = (self._record(answer, claim, fingerprints), False)
        return answers

    def _record(
        self, answer: ScanResult, claim: Claim, fingerprints: tuple[Any, ...]
    ) -> ScanResult:
        points = [(probe_key(r.config, *fingerprints), r) for r in answer.results]
        if not answer.affine and not _failed(answer):
            # No curve: the traced points are probes like any; the caller probes batch by batch.
            claim.release(points)
            return answer
        (_, first), *others = points
        claim.record(
            first, [r.config["batch_size"] for _, r in others], answer.window_floor, others
        )
        return answer


def _failed(answer: ScanResult) -> bool:
    return any(r.outcome in (Outcome.CRASH, Outcome.TIMEOUT) for r in answer.results)


def _stored_scan(
    prober: Prober,
    first: ProbeResult,
    lo: int,
    hi: int,
    fingerprints: tuple[Any, ...],
    reported: list[int] | None,
    window_floor: float | None,
) -> ScanResult:
    """A scan a study holds, from its first reported point and the others it names (`reported`;
    None, for a scan stored before it named them: the point above the best), where stored, and
    the floor of the window those hold (StudyRecorder.reported)."""
    results = [first]
    best = first.config["batch_size"] if first.outcome is Outcome.OK else None
    if first.outcome in (Outcome.CRASH, Outcome.TIMEOUT):
        return ScanResult(lo, hi, None, results, [], False, "the stored scan failed")
    if reported is None:
        reported = [best + 1] if best is not None and best < hi else []
    for batch in reported:
        point = prober.recorder.finished(
            probe_key({**first.config, "batch_size": batch}, *fingerprints)
        )
        if point is not None:
            results.append(point)
    return ScanResult(lo, hi, best, results, [], window_floor=window_floor)
