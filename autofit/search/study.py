"""Every probe of a search as an Optuna trial, and every finished probe reusable on a rerun.

A probe that fits is a COMPLETE trial with two objectives to maximise (samples per second, and
run size: batch x pixels) and its peak against the budget as a constraint; `oom`, `crash`,
`timeout` and `invalid` probes are FAIL trials with their outcome; a combination pruned without
probing is a PRUNED trial with the reason. All knobs, batch size and resolution are params; the
outcome, peak, breakdown, throughput, backend and the whole result are user attributes.

Each trial is written the moment its probe finishes, so a search killed with SIGKILL loses no
finished probe, and running the same command again finds every finished probe by its key
(knobs, batch, resolution, backend and budget) instead of repeating it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError
from autofit.knobs import registry
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


def probe_key(knobs: dict[str, Any], backend: str, budget_bytes: int, model: str, gpu: str) -> str:
    """What makes two probes the same probe: a study reuses a finished one only under this key,
    so a changed preset (`model` is its fingerprint), GPU entry or budget measures again."""
    return json.dumps(
        {"knobs": knobs, "backend": backend, "budget": budget_bytes, "model": model, "gpu": gpu},
        sort_keys=True,
    )


def pruned_key(knobs: dict[str, Any]) -> str:
    return json.dumps({"knobs": knobs, "pruned": True}, sort_keys=True)


def _distributions(params: dict[str, Any]) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    knobs = registry()
    distributions: dict[str, Any] = {}
    for name in params:
        knob = knobs[name]
        if knob.choices is not None:
            # Fixed to the knob's full set of values: Optuna wants one distribution per param name.
            distributions[name] = CategoricalDistribution(knob.choices)
        else:
            distributions[name] = IntDistribution(*_INT_RANGE)
    return distributions


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
        for trial in self.study.get_trials(deepcopy=False):
            key = trial.user_attrs.get("key")
            if key is not None:
                self._known[key] = trial

    def finished(self, key: str) -> ProbeResult | None:
        """The result of a probe this study already holds."""
        trial = self._known.get(key)
        if trial is None or "result" not in trial.user_attrs:
            return None
        return ProbeResult.from_dict(trial.user_attrs["result"])

    def record_probe(self, key: str, result: ProbeResult) -> None:
        import optuna
        from optuna.trial import TrialState

        params = dict(result.config)
        attrs = {
            "key": key,
            "kind": "probe",
            "outcome": result.outcome.value,
            "backend": result.backend,
            "peak_bytes": result.peak_bytes,
            "budget_bytes": result.budget_bytes,
            "breakdown": result.breakdown,
            "phase": result.phase,
            "samples_per_s": result.samples_per_s,
            "step_time_s": result.step_time_s,
            "result": _slim(result),
        }
        if result.outcome is Outcome.OK:
            from autofit.search.pareto import run_size as size_of

            run_size = size_of(result)
            trial = optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                values=[float(result.samples_per_s or 0.0), float(run_size)],
                params=params,
                distributions=_distributions(params),
                user_attrs=attrs,
                constraints={
                    "peak_over_budget": float((result.peak_bytes or 0) - result.budget_bytes)
                },
            )
        else:
            trial = optuna.trial.create_trial(
                state=TrialState.FAIL,
                params=params,
                distributions=_distributions(params),
                user_attrs=attrs,
            )
        self._add(key, trial)

    def record_pruned(self, knobs: dict[str, Any], reason: str) -> None:
        import optuna
        from optuna.trial import TrialState

        key = pruned_key(knobs)
        if key in self._known:
            return
        attrs = {"key": key, "kind": "pruned", "outcome": "pruned", "reason": reason}
        trial = optuna.trial.create_trial(
            state=TrialState.PRUNED,
            params=knobs,
            distributions=_distributions(knobs),
            user_attrs=attrs,
        )
        self._add(key, trial)

    def _add(self, key: str, trial: Any) -> None:
        with self._lock:  # one writer at a time: SQLite does not like concurrent writes
            self.study.add_trial(trial)
            self._known[key] = trial


def _slim(result: ProbeResult) -> dict[str, Any]:
    data = result.to_dict()
    if data.get("error"):
        data["error"] = {**data["error"], "log_tail": data["error"].get("log_tail", "")[-1000:]}
    return data
