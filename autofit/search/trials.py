"""A probe as an Optuna trial, and back: what a study holds of each probe and each claim.

A probe that fits is a COMPLETE trial with two objectives to maximise (samples per second, and
run size: batch x pixels) and its peak against the budget as a constraint; `oom`, `crash`,
`timeout` and `invalid` probes are FAIL trials with their outcome. All knobs, batch size and
resolution are params; the outcome, peak, breakdown, throughput, backend and the whole result are
user attributes. A claim (autofit/search/claims.py) is a RUNNING trial made from
`claim_template`. Optuna fixes each param's distribution at its first trial (`distribution`
makes one, `holds` says whether a stored one can take a value).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from autofit.knobs import REGISTRY, completed
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.claims import HEARTBEAT_ATTR, TIMEOUT_ATTR, WORKER_ATTR, this_worker
from autofit.search.pareto import run_size as size_of

DIRECTIONS = ("maximize", "maximize")  # samples/s, run size (batch x pixels)
_INT_RANGE = (0, 1 << 20)  # wide enough for any batch, resolution or count knob


def distribution(name: str, value: Any) -> Any:
    """The distribution a param of this knob is recorded with, in a study that has none yet:
    the knob's values, or a range for an integer knob (a value neither holds, from a knob this
    autofit does not know, is recorded alone)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    knob = REGISTRY.get(name)
    fresh: Any = IntDistribution(*_INT_RANGE)
    if knob is not None and knob.choices is not None:
        fresh = CategoricalDistribution(knob.choices)
    return fresh if holds(fresh, value) else CategoricalDistribution((value,))


def holds(distribution: Any, value: Any) -> bool:
    """Whether a stored distribution can record `value` as it is."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return any(c == value and type(c) is type(value) for c in distribution.choices)
    if isinstance(distribution, IntDistribution):
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and distribution.low <= value <= distribution.high
        )
    return False


def probe_trial(
    key: str, result: ProbeResult, params: dict[str, Any], distributions: dict[str, Any]
) -> Any:
    """A finished probe as the trial a study files it as (see the module's docstring): its
    params (the knobs, under the names `params` gives them) and distributions are the caller's."""
    import optuna
    from optuna.trial import TrialState

    attrs = {
        "key": key,
        "kind": "probe",
        "outcome": result.outcome.value,
        "backend": result.backend,
        "peak_bytes": result.peak_bytes,
        "budget_bytes": result.budget_bytes,
        "host_peak_bytes": result.host_peak_bytes,
        "host_budget_bytes": result.host_budget_bytes,
        "breakdown": result.breakdown,
        "phase": result.phase,
        "samples_per_s": result.samples_per_s,
        "step_time_s": result.step_time_s,
        # traced or replayed (simulated from a batch curve), or measured on the hardware
        "source": result.origin,
        "result": _slim(result),
    }
    if result.outcome is Outcome.OK:
        return optuna.trial.create_trial(
            params=params,
            distributions=distributions,
            state=TrialState.COMPLETE,
            values=[float(result.samples_per_s or 0.0), float(size_of(result))],
            user_attrs=attrs,
            constraints={"peak_over_budget": float((result.peak_bytes or 0) - result.budget_bytes)},
        )
    return optuna.trial.create_trial(
        params=params, distributions=distributions, state=TrialState.FAIL, user_attrs=attrs
    )


def claim_template(
    key: str, params: dict[str, Any], distributions: dict[str, Any], timeout_s: float
) -> Any:
    from optuna.trial import FrozenTrial, TrialState

    return FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        values=None,
        datetime_start=datetime.now(),
        datetime_complete=None,
        params=params,
        distributions=distributions,
        user_attrs={"key": key, "kind": "claim"},
        system_attrs={WORKER_ATTR: this_worker(), HEARTBEAT_ATTR: 0, TIMEOUT_ATTR: timeout_s},
        intermediate_values={},
        trial_id=-1,
    )


def read(data: Any) -> ProbeResult:
    result = ProbeResult.from_dict(data)
    result.config = completed(result.config)  # knobs added since, at their defaults
    return result


def _slim(result: ProbeResult) -> dict[str, Any]:
    data = result.to_dict()
    if data.get("error"):
        data["error"] = {**data["error"], "log_tail": data["error"].get("log_tail", "")[-1000:]}
    return data
