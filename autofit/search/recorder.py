"""Every probe of a search as an Optuna trial, and every finished probe reusable on a rerun.

How a probe is a trial is autofit/search/trials.py; a combination pruned without probing is a
PRUNED trial with the reason; the keys trials are filed under, autofit/search/keys.py.

Each trial is written the moment its probe finishes, so a search killed with SIGKILL loses no
finished probe, and running the same command again finds every finished probe by its key
(knobs, batch, resolution, backend and budget) instead of repeating it; except, by default, a
`crash` or `timeout` probe, which says more about that run than about the configuration, and is
probed again. Several workers on one study split its probes: each is claimed in the study before
it runs, and its result written into the claim's trial (autofit/search/claims.py).

A stored trial this autofit cannot read (written by another program, or an outcome it does not
know) is skipped with a warning naming its number and why. A claim that ended without a result
(lost to another worker's, given back, taken over) is a PRUNED trial that no reader takes for an
answer: only COMPLETE and FAIL trials are probes.

What is stored outlives the code that wrote it: keys are read whatever autofit wrote them
(autofit/search/keys.py). Optuna fixes each param's
distribution at its first trial and refuses another choice set under the same name, so a value
the stored distribution lacks (added to the knob since) is recorded under the next free versioned
name (`optimizer~2`), never by changing the stored one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofit.errors import ProbeNotFinished
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.claims import (
    HEARTBEAT_ATTR,
    Busy,
    Heartbeat,
    Liveness,
)
from autofit.search.closing import close_claim
from autofit.search.keys import normalized_key, pruned_key, significant
from autofit.search.retry import PATIENCE_S, retrying
from autofit.search.storage import open_study, shown
from autofit.search.trials import DIRECTIONS, claim_template, distribution, holds, probe_trial, read
from autofit.units import many

log = logging.getLogger(__name__)

REPORTED_ATTR = "reported"  # a scan's trial: the batches of its other reported points
# a scan's trial: the floor of the window whose batches it reported (autofit/records/probe.py
# ScanWindow); none, where it reported none
WINDOW_FLOOR_ATTR = "window_floor"
# Outcomes that say nothing of the configuration when autofit itself stopped, its probe server
# died or the machine was busy: a rerun probes them again unless told to keep them.
RETRIED = (Outcome.CRASH.value, Outcome.TIMEOUT.value)
# How long a stopping search waits to finish its writes and give back its claims: its stop
# signal gets 2 s in all (docs/cluster.md, Reliability).
CLOSE_S = 1.5


def default_storage(results_dir: Path) -> str:
    return f"sqlite:///{results_dir / 'studies.db'}"


class StudyRecorder:
    """Writes probes into an Optuna study and answers from the probes it already holds.

    Several recorders, in as many processes on as many machines, may share a study: `claim`
    lets one of them run each probe (see autofit/search/claims.py), and every answer is read
    from the study as it is now, not as it was when the recorder opened it. `retry_failed`
    leaves out `crash` and `timeout` probes that were already stored when the recorder opened
    the study (a rerun probes them again); those recorded since, by any worker, are answers.
    """

    def __init__(
        self,
        storage_url: str,
        study_name: str,
        attrs: dict[str, Any],
        retry_failed: bool = True,
        claim_grace_s: float = 60.0,
        patience_s: float = PATIENCE_S,
    ) -> None:
        """`patience_s`: how long a call waits for a storage that is away before the search
        ends, saying so (autofit/search/retry.py)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.patience_s = patience_s
        self.study = open_study(storage_url, study_name, list(DIRECTIONS), attrs, patience_s)
        # The storage's own calls (BaseStorage's documented interface) where Study has none:
        # a RUNNING trial made from a template, a state change refused on a finished trial.
        self._storage, self._study_id = self.study._storage, self.study._study_id
        self.name = study_name
        self.storage_url = storage_url
        self.retry_failed = retry_failed
        self.liveness = Liveness(claim_grace_s)
        self.heartbeat = Heartbeat(self._beat, claim_grace_s / 4)
        self._lock = threading.Lock()
        self._probes: dict[str, Any] = {}  # key -> the newest finished probe's trial
        self._pruned: set[str] = set()
        self._running: dict[str, list[Any]] = {}  # key -> its RUNNING trials: claims
        self._indexed: set[int] = set()  # trial ids of the finished trials read so far
        self._skipped: set[int] = set()  # trial numbers warned about
        self._stored: dict[str, Any] = {}  # param name -> the distribution the study fixed
        self._old_failures: set[int] | None = None
        self._closed = False
        # Writes in flight (a claim made, a result stored): `close` waits for them, so that
        # what it gives back and what it counts are final.
        self._writing = threading.Condition()
        self._in_flight = 0
        self.recorded = 0  # probes this recorder stored: the claims' results and scans' points
        self.unsettled = 0  # writes still in flight when `close` stopped waiting for them
        self.refresh()
        self._old_failures = {
            trial._trial_id
            for trial in self._probes.values()
            if trial.user_attrs["result"]["outcome"] in RETRIED
        }

    # -- reading the study ---------------------------------------------------------------------

    def refresh(self) -> None:
        """Read what changed in the study since the last look (Optuna's cache re-reads only
        unfinished and new trials)."""
        from optuna.trial import TrialState

        trials = self._retry(lambda: self.study.get_trials(deepcopy=False))
        running: dict[str, list[Any]] = defaultdict(list)
        with self._lock:
            for trial in trials:
                if trial.state is TrialState.RUNNING:
                    key = trial.user_attrs.get("key")
                    if isinstance(key, str):
                        running[normalized_key(key)].append(trial)
                elif trial._trial_id not in self._indexed:
                    self._indexed.add(trial._trial_id)
                    for name, distribution in trial.distributions.items():
                        self._stored.setdefault(name, distribution)
                    self._index(trial)
            self._running = dict(running)

    def _retry(self, action: Any, patience_s: float | None = None) -> Any:
        """A storage call, run again while the storage is away (autofit/search/retry.py)."""
        patience = self.patience_s if patience_s is None else patience_s
        return retrying(action, shown(self.storage_url), patience)

    def _index(self, trial: Any) -> None:
        """Files a finished trial under its key, or skips it, saying why, when autofit cannot
        read it (another writer's shape, an outcome this autofit does not know)."""
        from optuna.trial import TrialState

        attrs = trial.user_attrs
        key = attrs.get("key")
        if key is None:  # not autofit's: someone's own trial in the study
            return
        if not isinstance(key, str):
            return self._skip(trial, f"its key is {type(key).__name__}, not text")
        if attrs.get("kind") == "pruned":
            self._pruned.add(normalized_key(key))
            return
        if trial.state not in (TrialState.COMPLETE, TrialState.FAIL):
            return  # a claim that ended without a result (lost, released or taken over)
        if "result" not in attrs:
            return self._skip(trial, "it holds no result")
        try:
            read(attrs["result"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._skip(trial, f"its result cannot be read ({type(exc).__name__}: {exc})")
        self._probes[normalized_key(key)] = trial  # trials come in id order: the newest wins

    def _skip(self, trial: Any, why: str) -> None:
        if trial.number not in self._skipped:
            self._skipped.add(trial.number)
            log.warning("study %s: stored trial %d is skipped: %s", self.name, trial.number, why)

    def _usable(self, key: str) -> ProbeResult | None:
        with self._lock:
            trial = self._probes.get(key)
        if trial is None:
            return None
        if self.retry_failed and trial._trial_id in (self._old_failures or ()):
            return None
        return read(trial.user_attrs["result"])

    def finished(self, key: str) -> ProbeResult | None:
        """The result of a probe this study already holds (recorded by any worker)."""
        result = self._usable(key)
        if result is None:
            self.refresh()
            result = self._usable(key)
        return result

    def reported(self, key: str) -> tuple[list[int] | None, float | None]:
        """The batches of a stored scan's other reported points (None: stored before scans named
        them), and the floor of the window they hold (None: none)."""
        with self._lock:
            trial = self._probes.get(key)
        attrs = {} if trial is None else trial.user_attrs
        found, floor = attrs.get(REPORTED_ATTR), attrs.get(WINDOW_FLOOR_ATTR)
        batches = [int(b) for b in found] if isinstance(found, list) else None
        return batches, None if floor is None else float(floor)

    # -- claims --------------------------------------------------------------------------------

    def claim(self, key: str, knobs: dict[str, Any], timeout_s: float) -> Claim | None:
        """Claim probe `key` (with these knobs) for this worker. None: another worker recorded
        it meanwhile (`finished` has it). Raises `Busy` while a live worker holds it."""
        from optuna.exceptions import UpdateFinishedTrialError

        self.refresh()
        if self._usable(key) is not None:
            return None
        for trial in self._running.get(key, ()):
            reason = self.liveness.lapsed(trial._trial_id, trial.system_attrs)
            if reason is None:
                raise Busy(key)
            log.warning(
                "study %s: trial %d, a claim on %s, has lapsed (%s); probing it here",
                self.name, trial.number, _describe(knobs), reason,
            )  # fmt: skip
            try:
                self._end(trial._trial_id, f"taken over: {reason}")
            except UpdateFinishedTrialError:
                pass  # it finished, or another worker took it over first
        with self._lock:
            params, distributions = self._params(knobs)
        template = claim_template(key, params, distributions, timeout_s)
        with self._write():  # held before `close` looks: it gives back every claim made
            trial_id = self._retry(lambda: self._storage.create_new_trial(self._study_id, template))
            self.heartbeat.hold(trial_id)
        if self._closed:  # made as the search stopped, after `close` stopped waiting for it
            self._end(trial_id, "released", patience_s=0)
            raise ProbeNotFinished("the search is stopping: nothing more is stored")
        self.refresh()
        rivals = [t for t in self._running.get(key, ()) if t._trial_id < trial_id]
        if rivals or self._usable(key) is not None:
            try:
                self._end(trial_id, "lost")
            except UpdateFinishedTrialError:
                pass  # taken over already (its heartbeat came late past the grace): lost as well
            if rivals:
                raise Busy(key)
            return None
        return Claim(self, trial_id, key, set(params))

    def _count(self, stored: int) -> None:
        with self._writing:
            self.recorded += stored

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A write `close` waits for; refused (ProbeNotFinished) once the search is stopping."""
        with self._writing:
            if self._closed:
                raise ProbeNotFinished("the search is stopping: nothing more is stored")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._writing:
                self._in_flight -= 1
                self._writing.notify_all()

    def _beat(self, trial_id: int) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            self._storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, round(time.time(), 1))
        except UpdateFinishedTrialError:  # taken over by another worker: nothing to keep alive
            self.heartbeat.drop(trial_id)

    def _end(
        self,
        trial_id: int,
        why: str,
        points: list[tuple[str, ProbeResult]] | None = None,
        patience_s: float | None = None,
    ) -> None:
        """Ends a claim without a result: PRUNED, which no reader takes for an answer; with
        `points`, a scan's traced points (key, result) are stored with it, each as a probe."""
        self.heartbeat.drop(trial_id)
        others = [self._trial_of(key, result) for key, result in points or ()]
        with self._write() if others else contextlib.nullcontext():
            written = close_claim(
                self._storage, self._study_id, trial_id,
                lambda action: self._retry(action, patience_s), None, set(), why,
                self._unstored(others), self._old_failures,
            )  # fmt: skip
            self._count(len(written))

    def _finish(
        self,
        trial_id: int,
        key: str,
        result: ProbeResult,
        claimed: set[str],
        reported: list[int] | None = None,
        window_floor: float | None = None,
        points: list[tuple[str, ProbeResult]] | None = None,
    ) -> None:
        """Writes the probe's result into its claim (the trial `record_probe` would add) and a
        scan's other `points` (key, result) as trials of their own, in one step
        (autofit/search/closing.py); nothing, where another worker took the claim over."""
        from optuna.exceptions import UpdateFinishedTrialError

        frozen = self._trial_of(key, result)
        if reported is not None:
            frozen.user_attrs[REPORTED_ATTR] = list(reported)
        if window_floor is not None:
            frozen.user_attrs[WINDOW_FLOOR_ATTR] = window_floor
        others = [self._trial_of(k, r) for k, r in points or ()]
        try:
            # Stopping, the search gives this probe's claim back instead (`close`).
            with self._write():
                self.heartbeat.drop(trial_id)
                written = close_claim(
                    self._storage, self._study_id, trial_id, self._retry, frozen, claimed, "",
                    self._unstored(others), self._old_failures,
                )  # fmt: skip
                self._count(1 + len(written))
        except ProbeNotFinished:
            return
        except UpdateFinishedTrialError:
            log.warning(
                "study %s: another worker took over the probe %s (this worker's heartbeat had "
                "lapsed); its result here is not recorded%s",
                self.name, _describe(result.config),
                f", nor the {many(len(others), 'other point')} of its scan" if others else "",
            )  # fmt: skip

    def _unstored(self, trials: list[Any]) -> list[Any]:
        """Of these trials, those whose probe the study does not already answer as this
        recorder reads it (stored keys of an older autofit included: normalized_key)."""
        return [t for t in trials if self._usable(normalized_key(t.user_attrs["key"])) is None]

    def close(self, within_s: float = CLOSE_S) -> None:
        """Stops storing (a search that stops, or ends): waits for the writes in flight, gives
        back every claim still held, and stops the heartbeat, all within about `within_s`.
        `recorded` is final once this returns, unless a write outlasted the wait (on a busy
        database): it is stored whole or not at all, and a claim being made then may be left
        RUNNING, without a result, to be taken over (autofit/search/claims.py: at once by a
        worker on this machine, as its worker has exited)."""
        deadline = time.monotonic() + within_s
        with self._writing:
            if self._closed:
                return
            self._closed = True
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._writing.wait(left)
            self.unsettled = self._in_flight
            held = self.heartbeat.held()

        def give_back() -> None:
            for trial_id in held:
                try:  # one try each: a storage that is away must not hold up a stopping search
                    self._end(trial_id, "released", patience_s=0)
                except Exception:  # on the way out of an interrupt: it lapses instead
                    pass

        # In a thread of its own: a call the database blocks (a lock held elsewhere) is left
        # behind rather than waited for; the process's exit ends it, uncommitted.
        giver = threading.Thread(target=give_back, name="autofit-release", daemon=True)
        giver.start()
        giver.join(max(0.1, deadline - time.monotonic()))
        self.heartbeat.stop()

    # -- writing -------------------------------------------------------------------------------

    def _params(self, knobs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The knobs as params, each under a name whose stored distribution can hold its value
        (the knob's own name unless the study fixed it to a set the value is not in)."""
        params, distributions = {}, {}
        for name, value in knobs.items():
            for version in itertools.count(1):
                label = name if version == 1 else f"{name}~{version}"
                stored = self._stored.get(label)
                if stored is None:
                    stored = self._stored[label] = distribution(name, value)
                if holds(stored, value):
                    params[label], distributions[label] = value, stored
                    break
        return params, distributions

    def record_probe(self, key: str, result: ProbeResult) -> None:
        """Adds a finished probe as a trial of its own (a single writer's way: a search records
        through `claim`)."""
        frozen = self._trial_of(key, result)
        self._retry(lambda: self.study.add_trial(frozen))
        self._count(1)

    def _trial_of(self, key: str, result: ProbeResult) -> Any:
        with self._lock:
            params, distributions = self._params(result.config)
        return probe_trial(key, result, params, distributions)

    def record_pruned(self, knobs: dict[str, Any], reason: str) -> None:
        """Notes a combination pruned without probing, once (several workers reach the same
        note; one that records it while another does leaves two alike, which nothing counts)."""
        self.record_pruned_all([(knobs, reason)])

    def record_pruned_all(self, notes: list[tuple[dict[str, Any], str]]) -> None:
        """`record_pruned` for each (knobs, reason), the study read once for all of them (a
        search's invalid combinations, hundreds at its start: 3.6 s to 2.8 s for 332)."""
        fresh = [
            (knobs, reason) for knobs, reason in notes if pruned_key(knobs) not in self._pruned
        ]
        if fresh:
            self.refresh()
        for knobs, reason in fresh:
            self._note_pruned(knobs, reason)

    def _note_pruned(self, knobs: dict[str, Any], reason: str) -> None:
        import optuna
        from optuna.trial import TrialState

        key = pruned_key(knobs)
        with self._lock:
            if key in self._pruned:
                return
            self._pruned.add(key)
            params, distributions = self._params(knobs)
        attrs = {"key": key, "kind": "pruned", "outcome": "pruned", "reason": reason}
        frozen = optuna.trial.create_trial(
            params=params, distributions=distributions, state=TrialState.PRUNED, user_attrs=attrs
        )
        self._retry(lambda: self.study.add_trial(frozen))


class Claim:
    """A probe this worker holds in the study: record its result, or release it."""

    def __init__(self, recorder: StudyRecorder, trial_id: int, key: str, params: set[str]) -> None:
        self.recorder, self.trial_id, self.key = recorder, trial_id, key
        self.params = params  # the params the claim's trial was created with

    def record(
        self,
        result: ProbeResult,
        reported: list[int] | None = None,
        window_floor: float | None = None,
        points: list[tuple[str, ProbeResult]] | None = None,
    ) -> None:
        """Writes `result`; for a scan, `reported`: the batches of its other reported points,
        `window_floor`: the floor of the window they hold (StudyRecorder.reported), and
        `points`: those points (probe key, result), stored with it or not at all."""
        self.recorder._finish(
            self.trial_id, self.key, result, self.params, reported, window_floor, points
        )

    def release(self, points: list[tuple[str, ProbeResult]] | None = None) -> None:
        """Gives the probe back unanswered: autofit is stopping (another worker, or the next
        run, probes it), or, with `points` (probe key, result), a scan found no curve and its
        traced points are stored as probes of their own instead, with the release."""
        from optuna.exceptions import UpdateFinishedTrialError

        if points is not None:
            try:
                self.recorder._end(self.trial_id, "released: no curve", points)
            except ProbeNotFinished:  # the search is stopping: `close` gives the claim back
                pass
            except UpdateFinishedTrialError:
                log.warning(
                    "study %s: another worker took over a scan of this worker's (its heartbeat "
                    "had lapsed); its %s here are not recorded",
                    self.recorder.name, many(len(points), "point"),
                )  # fmt: skip
            return
        try:
            self.recorder._end(self.trial_id, "released", patience_s=0)
        except Exception:  # on the way out of an error, which it must not hide: it lapses instead
            pass


def _describe(knobs: dict[str, Any]) -> str:
    """A probe in a log line: its batch, resolution and the knobs not at their defaults."""
    named = {k: knobs[k] for k in ("batch_size", "resolution") if k in knobs}
    named.update(significant({k: v for k, v in knobs.items() if k not in named}))
    return " ".join(f"{k}={v}" for k, v in named.items())
