"""Every probe of a search as an Optuna trial, and every finished probe reusable on a rerun.

A probe that fits is a COMPLETE trial with two objectives to maximise (samples per second, and
run size: batch x pixels) and its peak against the budget as a constraint; `oom`, `crash`,
`timeout` and `invalid` probes are FAIL trials with their outcome; a combination pruned without
probing is a PRUNED trial with the reason. All knobs, batch size and resolution are params; the
outcome, peak, breakdown, throughput, backend and the whole result are user attributes.

Each trial is written the moment its probe finishes, so a search killed with SIGKILL loses no
finished probe, and running the same command again finds every finished probe by its key
(knobs, batch, resolution, backend and budget) instead of repeating it.

What is stored outlives the code that wrote it. A key leaves out every knob at its registry
default, so a study written before a knob existed (which ran it at that default) still finds its
probes; keys stored by an older autofit are read the same way. Optuna fixes each param's
distribution at its first trial and refuses another choice set under the same name, so a value
the stored distribution lacks (added to the knob since) is recorded under the next free versioned
name (`optimizer~2`), never by changing the stored one.
"""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError
from autofit.knobs import REGISTRY, completed
from autofit.probe.spec import Outcome, ProbeResult

DIRECTIONS = ("maximize", "maximize")  # samples/s, run size (batch x pixels)
_INT_RANGE = (0, 1 << 20)  # wide enough for any batch, resolution or count knob


def default_storage(results_dir: Path) -> str:
    return f"sqlite:///{results_dir / 'studies.db'}"


def _storage(url: str) -> Any:
    import optuna

    if url.startswith("journal:"):  # a journal file, for several workers on a shared filesystem
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return url


def _significant(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs that make a run differ from the default one: a knob at its default says nothing
    a study predating the knob did not run (a knob this autofit does not know is kept)."""

    def at_default(name: str, value: Any) -> bool:
        default = REGISTRY[name].default
        return value == default and type(value) is type(default)

    return {k: v for k, v in knobs.items() if k not in REGISTRY or not at_default(k, v)}


def probe_key(
    knobs: dict[str, Any],
    backend: str,
    budget_bytes: int,
    model: str,
    gpu: str,
    host_budget_bytes: int | None = None,
) -> str:
    """What makes two probes the same probe: a study reuses a finished one only under this key,
    so a changed preset (`model` is its fingerprint), GPU entry or budget measures again. A host
    budget is part of the key only when stated: a probe without one has the key it had before
    autofit counted host memory."""
    key = {"knobs": _significant(knobs), "backend": backend, "budget": budget_bytes,
           "model": model, "gpu": gpu}  # fmt: skip
    if host_budget_bytes is not None:
        key["host_budget"] = host_budget_bytes
    return json.dumps(key, sort_keys=True)


def pruned_key(knobs: dict[str, Any]) -> str:
    return json.dumps({"knobs": _significant(knobs), "pruned": True}, sort_keys=True)


def normalized_key(key: str) -> str:
    """A stored key as this autofit writes it (older ones listed every knob)."""
    try:
        data = json.loads(key)
    except ValueError:
        return key
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
        return key
    return json.dumps({**data, "knobs": _significant(data["knobs"])}, sort_keys=True)


def _distribution(name: str, value: Any) -> Any:
    """The distribution a param of this knob is recorded with, in a study that has none yet:
    the knob's values, or a range for an integer knob (a value neither holds, from a knob this
    autofit does not know, is recorded alone)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    knob = REGISTRY.get(name)
    fresh: Any = IntDistribution(*_INT_RANGE)
    if knob is not None and knob.choices is not None:
        fresh = CategoricalDistribution(knob.choices)
    return fresh if _holds(fresh, value) else CategoricalDistribution((value,))


def _holds(distribution: Any, value: Any) -> bool:
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


class StudyRecorder:
    """Writes probes into an Optuna study and answers from the probes it already holds."""

    def __init__(self, storage_url: str, study_name: str, attrs: dict[str, Any]) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            self.study = optuna.create_study(
                storage=_storage(storage_url),
                study_name=study_name,
                directions=list(DIRECTIONS),
                load_if_exists=True,
            )
        except Exception as exc:  # the storage URL is the user's: report it, not a traceback
            raise AutofitError(f"cannot open the study storage {storage_url}: {exc}") from None
        for key, value in attrs.items():
            self.study.set_user_attr(key, value)
        self.name = study_name
        self.storage_url = storage_url
        self._lock = threading.Lock()
        self._known: dict[str, Any] = {}
        self._stored: dict[str, Any] = {}  # param name -> the distribution the study fixed
        for trial in self.study.get_trials(deepcopy=False):
            key = trial.user_attrs.get("key")
            if key is not None:
                self._known[normalized_key(key)] = trial
            for name, distribution in trial.distributions.items():
                self._stored.setdefault(name, distribution)

    def _params(self, knobs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The knobs as params, each under a name whose stored distribution can hold its value
        (the knob's own name unless the study fixed it to a set the value is not in)."""
        params, distributions = {}, {}
        for name, value in knobs.items():
            for version in itertools.count(1):
                label = name if version == 1 else f"{name}~{version}"
                stored = self._stored.get(label)
                if stored is None:
                    stored = self._stored[label] = _distribution(name, value)
                if _holds(stored, value):
                    params[label], distributions[label] = value, stored
                    break
        return params, distributions

    def finished(self, key: str) -> ProbeResult | None:
        """The result of a probe this study already holds."""
        trial = self._known.get(key)
        if trial is None or "result" not in trial.user_attrs:
            return None
        result = ProbeResult.from_dict(trial.user_attrs["result"])
        result.config = completed(result.config)  # knobs added since, at their defaults
        return result

    def record_probe(self, key: str, result: ProbeResult) -> None:
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
            "result": _slim(result),
        }
        if result.outcome is Outcome.OK:
            from autofit.search.pareto import run_size as size_of

            self._add(
                key,
                result.config,
                state=TrialState.COMPLETE,
                values=[float(result.samples_per_s or 0.0), float(size_of(result))],
                user_attrs=attrs,
                constraints={
                    "peak_over_budget": float((result.peak_bytes or 0) - result.budget_bytes)
                },
            )
        else:
            self._add(key, result.config, state=TrialState.FAIL, user_attrs=attrs)

    def record_pruned(self, knobs: dict[str, Any], reason: str) -> None:
        from optuna.trial import TrialState

        key = pruned_key(knobs)
        if key in self._known:
            return
        attrs = {"key": key, "kind": "pruned", "outcome": "pruned", "reason": reason}
        self._add(key, knobs, state=TrialState.PRUNED, user_attrs=attrs)

    def _add(self, key: str, knobs: dict[str, Any], **trial: Any) -> None:
        import optuna

        with self._lock:  # one writer at a time: SQLite does not like concurrent writes
            params, distributions = self._params(knobs)
            frozen = optuna.trial.create_trial(params=params, distributions=distributions, **trial)
            self.study.add_trial(frozen)
            self._known[key] = frozen


def _slim(result: ProbeResult) -> dict[str, Any]:
    data = result.to_dict()
    if data.get("error"):
        data["error"] = {**data["error"], "log_tail": data["error"].get("log_tail", "")[-1000:]}
    return data
