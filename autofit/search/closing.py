"""Closing a claim in one step: its result and a scan's other points are stored together, or not
at all, and only while the claim is still this worker's.

A claim (autofit/search/claims.py) ends in one of two ways: with a result (COMPLETE or FAIL,
the probe's attributes written into it), or without (PRUNED, with why: released, lost, taken
over). A scan's claim may also bring other points (the batch above the best, the batches of its
window), each a trial of its own under its probe key.

On an RDBStorage (SQLite, PostgreSQL, MySQL) all of it is one transaction that first locks the
study's row, as Optuna's own trial creation does, then the claim's: so a worker whose claim was
taken over (PRUNED by another) writes nothing of it; a kill leaves either the RUNNING claim with
none of its result, or everything; and a point another worker stored or holds a claim on in the
meantime is left out (the study-row lock orders this transaction against that claim's creation:
exactly one of the two sees the other). A transaction retried after its commit was acknowledged
to no one (a connection dropped at that moment) finds its claim finished with a result, or ended
with its own reason, and stops there.

Known limitations (Optuna 5.0's JournalStorage has no transactions): on a journal file the
claim's own fields are written one by one with its state last, then the other points, only once
the journal accepted that state (a claim taken over refuses it). A kill part-way leaves a
RUNNING claim holding some of its attributes (which no reader takes for an answer) or a finished
scan missing some of its other points (probed again when asked for), never a point twice; but a
point stored by another worker between this worker's last read and its write is stored twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from autofit.search.claims import CLAIM_ATTR

Retry = Callable[[Callable[[], Any]], Any]  # runs a storage call under StudyRecorder's retry


def close_claim(
    storage: Any,
    study_id: int,
    trial_id: int,
    retry: Retry,
    result: Any | None,
    claimed: set[str],
    why: str = "",
    others: list[Any] | None = None,
    disregarded: set[int] | None = None,
) -> list[Any]:
    """End claim `trial_id` with `result` (a FrozenTrial: its params not in `claimed`, its
    attributes, values and state), or without a result (`result` None: PRUNED, saying `why`),
    and add the trials `others` whose key no other trial holds (finished, or claimed and
    running; trials in `disregarded`, results a rerun probes again, aside). Returns the others
    written. Raises optuna's UpdateFinishedTrialError, having written nothing of the claim's,
    when the claim is no longer running (another worker took it over)."""
    from optuna.storages import RDBStorage

    others = others or []
    backend = getattr(storage, "_backend", storage)  # _CachedStorage wraps an RDBStorage
    if isinstance(backend, RDBStorage):
        return retry(
            lambda: _in_one_transaction(
                backend, study_id, trial_id, result, claimed, why, others, disregarded or set()
            )
        )
    return _one_by_one(storage, study_id, trial_id, retry, result, claimed, why, others)


def _in_one_transaction(
    rdb: Any,
    study_id: int,
    trial_id: int,
    result: Any | None,
    claimed: set[str],
    why: str,
    others: list[Any],
    disregarded: set[int],
) -> list[Any]:
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import TrialState

    with _create_scoped_session(rdb.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        claim = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        if claim.state.is_finished():
            if _already_closed(session, models, claim, why):
                return []  # this transaction committed before, unacknowledged
            raise UpdateFinishedTrialError(f"trial {trial_id} (a claim) is already finished")
        if result is None:
            rdb._set_trial_attr_without_commit(
                session, models.TrialSystemAttributeModel, trial_id, CLAIM_ATTR, why
            )
            claim.state = TrialState.PRUNED
        else:
            _write_result(rdb, session, models, claim, result, claimed)
        claim.datetime_complete = datetime.now()
        taken = _held_keys(session, models, study_id, others, trial_id, disregarded)
        written = [t for t in others if t.user_attrs["key"] not in taken]
        for trial in written:
            rdb._get_prepared_new_trial(study_id, trial, session)
        return written


def _write_result(
    rdb: Any, session: Any, models: Any, claim: Any, result: Any, claimed: set[str]
) -> None:
    """The probe's trial written into its claim, as Optuna writes each field (without commit)."""
    trial_id = claim.trial_id
    for name, value in result.params.items():
        if name in claimed:  # a scan's claim was made before its batch was known
            continue
        distribution = result.distributions[name]
        rdb._set_trial_param_without_commit(
            session, trial_id, name, distribution.to_internal_repr(value), distribution
        )
    for model, attrs in (
        (models.TrialUserAttributeModel, result.user_attrs),
        (models.TrialSystemAttributeModel, result.system_attrs),
    ):
        for key, value in attrs.items():
            rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)
    for objective, value in enumerate(result.values or ()):
        rdb._set_trial_value_without_commit(session, claim, objective, value)
    claim.state = result.state


def _already_closed(session: Any, models: Any, claim: Any, why: str) -> bool:
    """Whether a finished claim was finished by this very write: with a result (only its own
    worker gives a claim one), or ended with this write's own reason."""
    from optuna.trial import TrialState

    if claim.state in (TrialState.COMPLETE, TrialState.FAIL):
        return not why
    if claim.state is TrialState.PRUNED and why:
        said = models.TrialSystemAttributeModel.find_by_trial_and_key(claim, CLAIM_ATTR, session)
        return said is not None and json.loads(said.value_json) == why
    return False


def _held_keys(
    session: Any,
    models: Any,
    study_id: int,
    trials: list[Any],
    own: int,
    disregarded: set[int],
) -> set[str]:
    """Of the keys of `trials`, those another trial of the study holds: a finished probe (not
    one of `disregarded`) or a running claim (not `own`)."""
    from optuna.trial import TrialState

    if not trials:
        return set()
    wanted = {json.dumps(t.user_attrs["key"]): t.user_attrs["key"] for t in trials}
    attr, trial = models.TrialUserAttributeModel, models.TrialModel
    rows = (
        session.query(attr.value_json, trial.trial_id)
        .join(trial, attr.trial_id == trial.trial_id)
        .filter(
            trial.study_id == study_id,
            attr.key == "key",
            attr.value_json.in_(list(wanted)),
            trial.state.in_([TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING]),
        )
        .all()
    )
    return {
        wanted[value] for value, trial_id in rows if trial_id != own and trial_id not in disregarded
    }


def _one_by_one(
    storage: Any,
    study_id: int,
    trial_id: int,
    retry: Retry,
    result: Any | None,
    claimed: set[str],
    why: str,
    others: list[Any],
) -> list[Any]:
    """Any other storage: the claim's fields, its state last (refused once taken over), then
    the others (see Known limitations above)."""
    from optuna.trial import TrialState

    if result is None:
        retry(lambda: storage.set_trial_system_attr(trial_id, CLAIM_ATTR, why))
        retry(lambda: storage.set_trial_state_values(trial_id, TrialState.PRUNED))
    else:
        for name, value in result.params.items():
            if name in claimed:
                continue
            distribution = result.distributions[name]
            retry(lambda n=name, v=value, d=distribution: storage.set_trial_param(
                trial_id, n, d.to_internal_repr(v), d
            ))  # fmt: skip
        for key, value in result.user_attrs.items():
            retry(lambda k=key, v=value: storage.set_trial_user_attr(trial_id, k, v))
        for key, value in result.system_attrs.items():
            retry(lambda k=key, v=value: storage.set_trial_system_attr(trial_id, k, v))
        retry(lambda: storage.set_trial_state_values(trial_id, result.state, result.values))
    for trial in others:
        retry(lambda t=trial: storage.create_new_trial(study_id, t))
    return others
