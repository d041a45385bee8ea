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

A job that dies without a result (SLURM kills it at its time limit or memory) breaks that channel:
the submitit launcher's `launch()` waits on its jobs in order with `job.results()`, which raises
submitit's UncompletedJobError for the first one with no result file, and the JobReturns of all the
others are lost. The sweep then takes the launcher's own submitit Job objects (the `jobs` list in
the frame of `BaseSubmititLauncher.launch`, hydra-submitit-launcher 1.2.0, which pyproject pins)
from the exception's traceback, and the returns of the sweeper's earlier batches (the `returns` list
of `BasicSweeper.sweep`), and asks every job for its result itself: a live Job is the only handle
that can wait for a job still running (a submitit_local job is known by its process; one rebuilt
from the `.submitit` folder reports no process and no result while it runs), and it gives SLURM's
state (TIMEOUT, OUT_OF_MEMORY, ...) for a dead one. Anything the sweep cannot attribute to jobs
stays one line naming the launcher's error.

What a sweep leaves: its folder (`hydra.sweep.dir`, results/multirun/<date_time>/ by default)
holds Hydra's multirun.yaml, submitit's logs under .submitit/, and, for `autofit search`, the
sweep's table (sweep.csv, autofit/commands/sweep_table.py), printed as the sweep ends. No folder
is left empty: see JOB_FOLDERS and `_remove_empty_folders`.
"""

from __future__ import annotations

import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from autofit.commands.sweep_table import (
    COLUMNS,
    SWEEP_TABLE,
    csv_text,
    job_row,
    settings_columns,
    table_text,
)
from autofit.config import validate_overrides
from autofit.errors import AutofitError
from autofit.paths import conf_dir, write_atomically

try:  # the submitit launchers' own classes, where they are installed (pyproject's `cluster` extra)
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    from submitit.core.core import Job
    from submitit.core.utils import FailedJobError, UncompletedJobError
except ImportError:
    BaseSubmititLauncher = None  # type: ignore[assignment,misc]

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


class DiedWithoutResult(Exception):
    """Stands for the return of a job that ended without a result: `state` is submitit's word for
    it (SLURM's job state, e.g. TIMEOUT or OUT_OF_MEMORY; FINISHED or INTERRUPTED for a local job's
    process)."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


def failed_jobs(returns: Sequence[Any]) -> list[tuple[str, str]]:
    """(the job's overrides, how it failed) for every job that did not exit 0 (`how_failed`).
    `returns` is what `Hydra.multirun` gives: a list per batch of the sweeper, of JobReturns."""
    failed = []
    for batch in returns:
        for ret in batch:
            how = how_failed(ret)
            if how is not None:
                failed.append((" ".join(ret.overrides or []) or "the default run", how))
    return failed


def how_failed(ret: Any) -> str | None:
    """How a job failed: `exit <status>`, or `died without a result: state <submitit's state>`;
    None when it exited 0. A job whose Hydra run itself failed (status FAILED: it raised before or
    after the task, or in the launcher's own code in the job) counts as failed with the
    exception's type as its status."""
    if isinstance(ret._return_value, DiedWithoutResult):
        return f"died without a result: state {ret._return_value.state}"
    if ret.status == JobStatus.FAILED:
        return f"exit {type(ret._return_value).__name__}"
    if ret.status != JobStatus.COMPLETED:
        return f"exit {str(ret.status.name).lower()}"
    if ret.return_value:
        return f"exit {ret.return_value}"
    return None


def summary_line(failed: list[tuple[str, str]], total: int) -> str:
    jobs = "; ".join(f"{_without_password(name)} ({how})" for name, how in failed)
    return f"autofit: {len(failed)} of {total} jobs of the sweep failed: {jobs}"


def returns_of_a_stopped_launcher(exc: BaseException) -> list[list[Any]] | None:
    """What `Hydra.multirun` would have returned had the submitit launcher not raised `exc`: the
    earlier batches' returns and, for the batch it stopped in, every job's JobReturn, waiting for
    the jobs still running; a job with no result becomes a FAILED JobReturn holding
    DiedWithoutResult, one whose submitit call raised a FAILED one holding submitit's
    FailedJobError. None when `exc` did not come from a submitit launcher waiting on its jobs."""
    if BaseSubmititLauncher is None:
        return None
    frames = {}
    tb = exc.__traceback__
    while tb is not None:
        frames[tb.tb_frame.f_code] = tb.tb_frame.f_locals
        tb = tb.tb_next
    launch = frames.get(BaseSubmititLauncher.launch.__code__)
    if launch is None or not isinstance(exc, (UncompletedJobError, FailedJobError)):
        return None
    jobs, job_overrides = launch.get("jobs"), launch.get("job_overrides")
    if jobs is None or job_overrides is None or len(jobs) != len(job_overrides):
        return None
    earlier = frames.get(BasicSweeper.sweep.__code__, {}).get("returns", [])
    # the job `exc` is about: already waited for, its result is known to be missing
    known_dead = frames.get(Job._get_outcome_and_result.__code__, {}).get("self")
    return [
        *earlier,
        [
            _job_return(list(o), job, job is known_dead)
            for o, job in zip(job_overrides, jobs, strict=True)
        ],
    ]


def _job_return(overrides: list[str], job: Any, known_dead: bool) -> Any:
    """The job's JobReturn, waiting for it to end (`results()` also waits, up to submitit's 15 s,
    for a result file a shared disk is slow to show)."""
    try:
        if not known_dead:
            return job.results()[0]
    # FailedJobError (a kind of UncompletedJobError): the launcher's own code in the job raised
    # (run_job turns the task's errors into a FAILED JobReturn), or the job could not load its call
    except FailedJobError as exc:
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=exc)
    except UncompletedJobError:
        pass
    except Exception as exc:  # noqa: BLE001 - e.g. a result file that cannot be read
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=exc)
    died = DiedWithoutResult(job.state)
    return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=died)


def _without_password(overrides: str) -> str:
    """The overrides with a storage URL's password masked: `postgresql://user:***@host/db`. Hydra
    hands them back escaped for its parser (`postgresql\\://user\\:secret@...`)."""
    return re.sub(r"(//[^/@\s]*?\\?:)[^@\s/]+@", r"\1***@", overrides)


def sweep(command: str, overrides: list[str], task: Callable[[Any], int]) -> int:
    """Run `task` on every configuration the sweep composes; non-zero if any job failed, with one
    line on stderr naming each failed job's overrides and exit status. A sweep of `autofit
    search` ends with its table (autofit/commands/sweep_table.py), printed and in the sweep's
    folder."""
    overrides = validate_overrides(command, overrides, sweep=True)  # a GPU file: its stored name
    hydra_overrides = [
        "hydra.sweep.dir=results/multirun/${now:%Y-%m-%d_%H-%M-%S}",
        *JOB_FOLDERS,
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
        *overrides,  # after autofit's: a user's hydra.sweep.dir (or subdir) wins
    ]
    started = time.time()
    with initialize_config_dir(
        config_dir=str(conf_dir()), version_base="1.3", job_name=f"autofit_{command}"
    ):
        hydra = GlobalHydra.instance().hydra
        returns: Any = None
        folders: dict[str, Path] = {}
        try:
            # The sweep's folder, resolved once (a `${now:...}` in it is read again wherever it
            # is used) and pinned, so the table and the tidying name the folder the jobs used.
            master = hydra.compose_config(command, hydra_overrides, run_mode=RunMode.MULTIRUN)
            folders = _sweep_folders(master)
            hydra_overrides.append(f"hydra.sweep.dir={_quoted(str(folders['sweep']))}")
            returns = hydra.multirun(
                config_name=command, task_function=SweepJob(task), overrides=hydra_overrides
            )
        except (AutofitError, KeyboardInterrupt):
            raise
        except Exception as exc:
            # The launcher itself gave up, and with it the returns of the jobs that did finish:
            # submitit raises for a job the cluster killed (time limit, memory) instead of
            # returning it. Its jobs answer for themselves where the sweep can reach them.
            returns = returns_of_a_stopped_launcher(exc)
            if returns is None:
                # submitit's first two lines: the job and its result file, and why it has none
                what = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
                raise AutofitError(
                    f"the sweep's launcher stopped: {type(exc).__name__}: {what}"
                ) from exc
        finally:
            if folders:
                _remove_empty_folders(folders, returns or [])
    jobs = [ret for batch in returns for ret in batch]
    if command == "search":
        multirun = folders["sweep"] / "multirun.yaml"  # written by the sweeper before any job
        since = multirun.stat().st_mtime if multirun.is_file() else started
        _print_table(jobs, folders["sweep"], since)
    failed = failed_jobs(returns)
    if failed:
        print(summary_line(failed, len(jobs)), file=sys.stderr)
        return 1
    return 0


# Hydra makes a folder per job (`<sweep dir>/<hydra.sweep.subdir>`) and copies the job's config
# into its `.hydra/`; a job of autofit writes nothing there (a search writes results/<study>/,
# submitit its logs under .submitit/), so each would be left holding only Hydra's copies. With
# no copies and the sweep's own folder as every job's, there are none: what each job ran is its
# row in the table (and the failure line), and multirun.yaml holds the sweep's configuration.
JOB_FOLDERS = ("hydra.output_subdir=null", "hydra.sweep.subdir=.")


def _sweep_folders(master: Any) -> dict[str, Path]:
    """The sweep's folder, resolved, and where submitit keeps its jobs' logs (a template with
    `%j` for the job id) when a submitit launcher runs it."""
    folders = {"sweep": Path(str(master.hydra.sweep.dir))}
    # `${hydra.sweep.dir}/.submitit/%j` by default: the same `now`, which Hydra keeps per config
    submitit = OmegaConf.select(master, "hydra.launcher.submitit_folder", default=None)
    if submitit:
        folders["submitit"] = Path(str(submitit))
    return folders


def _quoted(text: str) -> str:
    """`text` as a quoted value of a Hydra override, read back as it is: quotes, backslashes
    before them (or at the end) and `${` escaped."""
    body = re.sub(
        r"(\\*)('|\$\{|$)",
        lambda m: m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else ""),
        text,
    )
    return f"'{body}'"


def _remove_empty_folders(folders: dict[str, Path], returns: Sequence[Any]) -> None:
    """The folders a sweep leaves empty, removed: submitit_local makes its log folder's template
    itself (`.submitit/%j`, literally) and never writes there, and a `hydra.sweep.subdir` a user
    sets makes a folder per job. `rmdir` removes a folder only when empty: nothing with content
    is ever removed."""
    sweep_dir = folders["sweep"].absolute()
    empty = []
    template = folders.get("submitit")
    if template is not None and "%" in str(template):
        parts = template.absolute().parts
        tagged = next(i for i, part in enumerate(parts) if "%" in part)
        empty.append((template.absolute(), Path(*parts[:tagged])))
    for batch in returns:
        for ret in batch:  # a job that died has no config: with a subdir, its folder is kept
            if getattr(ret, "hydra_cfg", None) is not None:
                output_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
                empty.append((Path(str(output_dir)), sweep_dir))
    for folder, top in empty:
        while folder != top and top in folder.parents:
            try:
                folder.rmdir()
            except OSError:  # not empty (or already gone): kept
                break
            folder = folder.parent


def _print_table(jobs: Sequence[Any], sweep_dir: Path, since: float) -> None:
    """The sweep's table on stdout and in `<sweep dir>/sweep.csv` (written whole or not at all)."""
    masked = [[_without_password(o) for o in ret.overrides or []] for ret in jobs]
    rows = [
        job_row(overrides, getattr(ret, "cfg", None), how_failed(ret), since)
        for overrides, ret in zip(masked, jobs, strict=True)
    ]
    columns = [*settings_columns(masked), *COLUMNS]
    print("\n" + table_text(columns, rows), flush=True)
    path = sweep_dir / SWEEP_TABLE
    try:
        write_atomically(path, csv_text(columns, rows))
    except OSError as exc:
        print(f"autofit: cannot write the sweep's table to {path}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return
    print(f"the sweep's table: {path}", flush=True)
