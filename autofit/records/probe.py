"""What goes into a probe (`ProbeSpec`) and what comes out (`ProbeResult`), both plain JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from autofit.gpus import GpuSpec


class Outcome(str, Enum):
    """How a probe ended. A closed set: callers compare against these, never against text."""

    OK = "ok"  # ran and fits the budget
    OOM = "oom"  # ran out of the budget (simulated) or out of memory (real)
    OOM_HOST = "oom_host"  # fits the GPU, but its host memory exceeds the host budget
    TIMEOUT = "timeout"  # ran past its time limit and was killed
    CRASH = "crash"  # the worker died or raised something other than out-of-memory
    INVALID = "invalid"  # cannot run on this GPU and model at all; decided before running


DEFAULT_MARGIN = 0.05  # the share of a GPU's memory a probe keeps free unless told otherwise
# Outcomes that say the configuration does not fit: the search treats them alike.
DOES_NOT_FIT = (Outcome.OOM, Outcome.OOM_HOST)


@dataclass(frozen=True)
class ProbeSpec:
    """One configuration to measure: the model preset and GPU entry in full, every knob's value
    (resolution resolved), the backend, and the limits: the GPU's budget (its memory less the
    margin) and the host's (`host_memory_bytes`; None: not stated, no host limit)."""

    model: dict[str, Any]
    gpu: dict[str, Any]
    knobs: dict[str, Any]
    backend: str = "auto"
    margin: float = DEFAULT_MARGIN
    timeout_s: float = 900.0
    host_memory_bytes: int | None = None

    @property
    def gpu_spec(self) -> GpuSpec:
        return GpuSpec.from_dict(self.gpu)

    @property
    def budget_bytes(self) -> int:
        return self.gpu_spec.budget_bytes(self.margin)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ProbeSpec:
        return cls(**json.loads(text))

    def at_batch(self, batch: int) -> ProbeSpec:
        """The same configuration at batch size `batch`."""
        return replace(self, knobs={**self.knobs, "batch_size": batch})


@dataclass
class ProbeResult:
    """One probe's answer. Memory fields are bytes; `peak_bytes` is what the GPU must hold at the
    peak (allocator reservation and fixed overheads included), `breakdown` what was live at the
    allocated peak plus `overhead` (so its values sum to `peak_bytes`). `host_peak_bytes` is the
    host memory the run held at its host peak (`host_pinned_bytes` page-locked plus
    `host_pageable_bytes`), in `host_phase`, against `host_budget_bytes` (None: not stated);
    results written before autofit counted host memory have None there."""

    outcome: Outcome
    backend: str
    gpu: str
    model: str
    config: dict[str, Any]
    budget_bytes: int
    peak_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    breakdown: dict[str, int] | None = None
    overhead_detail: dict[str, int] | None = None
    phase: str | None = None
    phase_peaks: dict[str, int] | None = None
    host_peak_bytes: int | None = None
    host_pinned_bytes: int | None = None
    host_pageable_bytes: int | None = None
    host_phase: str | None = None
    host_budget_bytes: int | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None  # language models: samples/s times the sequence length
    units_per_sample: int | None = None  # pixels (or tokens) one sample carries
    step_time_s: float | None = None
    throughput_estimated: bool | None = None
    flops_per_sample: float | None = None
    param_count: int | None = None
    trainable_param_count: int | None = None
    error: dict[str, str] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    wall_s: float | None = None
    # Where a simulated point's figures come from: "traced" (its own fake step), "replayed" (a
    # batch curve traced at other batches: autofit/fastpath/batch_curve.py); None: a probe of
    # its own (traced when simulated, measured otherwise), as every result before curves.
    source: str | None = None

    @property
    def origin(self) -> str:
        """Where the figures come from: "traced" or "replayed" (simulated), or "measured"."""
        return self.source or ("traced" if self.backend == "simulate" else "measured")

    @classmethod
    def failed(
        cls,
        spec: ProbeSpec,
        outcome: Outcome,
        message: str,
        log_tail: str = "",
        backend: str | None = None,
    ) -> ProbeResult:
        return cls(
            outcome=outcome,
            backend=backend or spec.backend,
            gpu=spec.gpu["name"],
            model=spec.model["name"],
            config=dict(spec.knobs),
            budget_bytes=spec.budget_bytes,
            host_budget_bytes=spec.host_memory_bytes,
            error={"message": message, "log_tail": log_tail},
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["outcome"] = Outcome(values["outcome"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> ProbeResult:
        return cls.from_dict(json.loads(text))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)  # atomic: a reader never sees half a result


@dataclass(frozen=True)
class ScanWindow:
    """What a scan at the target resolution reports for the best rule (autofit/search/pareto.py
    BestRule): every batch from `min_batch` up that fits and runs at least `floor` samples/s and
    within `tolerance` of the structure's own fastest. The search's floor, (1 - tolerance) of the
    fastest run of all, is at least as high as either, so each run the rule could choose is then
    reported. `floor`: what the search knew when it asked (0: nothing yet)."""

    min_batch: int
    tolerance: float
    floor: float = 0.0

    def threshold(self, own_fastest: float) -> float:
        """The least samples/s a reported batch of a structure whose fastest is `own_fastest`
        runs at."""
        return max(self.floor, (1 - self.tolerance) * own_fastest)


@dataclass
class ScanResult:
    """What a scan of one structure over batches `lo`..`hi` found (autofit/fastpath/scan.py).

    `best_batch`: the largest batch that fits (None: none does). `results`: the points the search
    reports: the best batch and the one above it (or `lo` when none fits), and with a window
    asked for, the batches in it (ScanWindow), each with its figures and `source`; with `affine`
    false (the traces did not lie on one line, `reason` says why), the traced points instead,
    and `best_batch` is not known: the caller probes batch by batch. `traced`: the batches
    traced. `window_floor`: the floor of the window whose batches are all reported (None: no
    window was, and the caller looks for them itself)."""

    lo: int
    hi: int
    best_batch: int | None
    results: list[ProbeResult]
    traced: list[int]
    affine: bool = True
    reason: str = ""
    shared: bool = False  # its curve grew as another structure's (batch_curve.shared_with)
    window_floor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "results": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScanResult:
        data = dict(data)
        data["results"] = [ProbeResult.from_dict(r) for r in data["results"]]
        return cls(**data)
