"""`autofit <command> -m key=a,b ...`: a Hydra multirun, one command run per combination of the
comma-separated values, through whichever Hydra launcher is chosen (`hydra/launcher=...`): the
basic one runs them one after another here, joblib in worker processes here, submitit_local and
submitit_slurm as submitit jobs (SLURM's on the cluster).

How failures come back: every job returns its exit status as the task function's return value,
which Hydra hands back inside the job's JobReturn; each launcher returns the JobReturns of its
jobs to the sweeper, and the sweeper returns them all from `Hydra.multirun` (hydra-core 1.3:
hydra/_internal/hydra.py, core_plugins/basic_sweeper.py; hydra_plugins/hydra_joblib_launcher/
_core.py and hydra_submitit_launcher/submitit_launcher.py return `run_job`'s JobReturn from the
worker or the cluster job, pickled). This is the one channel every launcher shares: a list filled
inside the job (what this module did before) stays in the worker's process, and status files in
the job folders would need a shared disk and miss a job that never started. `hydra.main` drops the
returns, so the sweep calls `Hydra.multirun` itself, inside `initialize_config_dir`.

A job never raises: an error becomes its exit status, so the basic sweeper (which re-raises the
first failed job's exception and stops) runs every job, and a job that returns or raises reads the
same in the summary.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from autofit.config import validate_overrides
from autofit.errors import AutofitError
from autofit.paths import conf_dir

# What a job that raised something other than an AutofitError returns, as `autofit` itself would
# exit on an unexpected error.
UNEXPECTED_ERROR = 1


class SweepJob:
    """The task Hydra runs for each job of the sweep: `task(cfg)`'s exit status, errors included.
    A class, not a closure, so joblib and submitit pickle it by reference to this module."""

    def __init__(self, task: Callable[[Any], int]) -> None:
        self.task = task

    def __call__(self, cfg: Any) -> int:
        try:
            return int(self.task(cfg) or 0)
        except AutofitError as exc:
            print(f"autofit: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else UNEXPECTED_ERROR
            return code
        except Exception:  # noqa: BLE001 - reported in the job's log and as its exit status
            traceback.print_exc()
            return UNEXPECTED_ERROR


def failed_jobs(returns: Sequence[Any]) -> list[tuple[str, int | str]]:
    """(the job's overrides, its exit status) for every job that did not exit 0. `returns` is what
    `Hydra.multirun` gives: a list per batch of the sweeper, of JobReturns. A job whose Hydra run
    itself failed (status FAILED: it raised before or after the task) counts as failed with the
    exception's type as its status."""
    from hydra.core.utils import JobStatus

    failed = []
    for batch in returns:
        for ret in batch:
            name = " ".join(ret.overrides or []) or "the default run"
            if ret.status == JobStatus.FAILED:
                failed.append((name, type(ret._return_value).__name__))
            elif ret.status != JobStatus.COMPLETED:
                failed.append((name, str(ret.status.name).lower()))
            elif ret.return_value:
                failed.append((name, ret.return_value))
    return failed


def summary_line(failed: list[tuple[str, int | str]], total: int) -> str:
    jobs = "; ".join(f"{_without_password(name)} (exit {code})" for name, code in failed)
    return f"autofit: {len(failed)} of {total} jobs of the sweep failed: {jobs}"


def _without_password(overrides: str) -> str:
    """The overrides with a storage URL's password masked: `postgresql://user:***@host/db`. Hydra
    hands them back escaped for its parser (`postgresql\\://user\\:secret@...`)."""
    return re.sub(r"(//[^/@\s]*?\\?:)[^@\s/]+@", r"\1***@", overrides)


def sweep(command: str, overrides: list[str], task: Callable[[Any], int]) -> int:
    """Run `task` on every configuration the sweep composes; non-zero if any job failed, with one
    line on stderr naming each failed job's overrides and exit status."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = validate_overrides(command, overrides)  # a GPU file becomes its stored name
    hydra_overrides = [
        *overrides,
        "hydra.sweep.dir=results/multirun/${now:%Y-%m-%d_%H-%M-%S}",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]
    with initialize_config_dir(
        config_dir=str(conf_dir()), version_base="1.3", job_name=f"autofit_{command}"
    ):
        try:
            returns = GlobalHydra.instance().hydra.multirun(
                config_name=command, task_function=SweepJob(task), overrides=hydra_overrides
            )
        except (AutofitError, KeyboardInterrupt):
            raise
        except Exception as exc:
            # The launcher itself gave up, and with it the returns of the jobs that did finish:
            # submitit raises for a job the cluster killed (time limit, memory) instead of
            # returning it.
            # submitit's first two lines: the job and its result file, and why it has none
            what = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
            raise AutofitError(
                f"the sweep's launcher stopped: {type(exc).__name__}: {what}"
            ) from exc
    failed = failed_jobs(returns)
    if failed:
        print(summary_line(failed, sum(len(batch) for batch in returns)), file=sys.stderr)
        return 1
    return 0
