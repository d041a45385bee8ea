"""The parent side of a probe: run the worker in its own process, and always come back with a
result.

Each probe gets a fresh interpreter, so process exit is the reset: no allocator state, autocast
cache or CUDA context leaks from one probe into the next (the trap of in-process finders). The
worker runs in a new session so that a timeout kills its whole process group, including any
process it started. The parent never raises because a child failed: a timeout, a crash or an
out-of-memory error is an ordinary `ProbeResult`. It raises only when the child did not fail but
was cut short by autofit itself (an interrupt, a dead fork server): that is no answer to record.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import time
from pathlib import Path

from autofit.errors import ProbeNotFinished
from autofit.knobs import invalid_reason
from autofit.knobs.allocator import worker_environment
from autofit.models import ModelPreset
from autofit.probe.launcher import Launcher, ServerDied, SpawnLauncher
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec

log = logging.getLogger(__name__)

WORKER = "autofit.probe.worker"
LOG_TAIL_CHARS = 4000


def log_tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL_CHARS:].decode("utf-8", errors="replace")


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the probe worker was killed by {name}"
    return f"the probe worker exited with code {returncode} without writing a result"


def run_probe(
    spec: ProbeSpec,
    worker: str = WORKER,
    log_path: Path | None = None,
    launcher: Launcher | None = None,
) -> ProbeResult:
    """Measure `spec` in a subprocess running `python -m <worker> SPEC RESULT`.

    `log_path` keeps the worker's combined stdout and stderr; by default it is discarded with the
    temporary directory. `launcher` starts the process (default: a fresh interpreter).

    Raises ProbeNotFinished, and returns no result, when the probe ended for a reason of
    autofit's own: the launcher was stopped (the search is interrupted), or its fork server died
    under it twice (once is retried on a fresh server). An exception raised here (an interrupt)
    kills the worker's group before it propagates.
    """
    reason = invalid_reason(
        spec.knobs, spec.gpu_spec, ModelPreset.from_dict(spec.model), spec.backend
    )
    if reason:
        result = ProbeResult.failed(spec, Outcome.INVALID, reason)
        result.wall_s = 0.0
        return result

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autofit-probe-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        log_file = log_path or Path(tmp) / "worker.log"
        spec_path.write_text(spec.to_json())
        returncode, waited = run_retried(
            spec, launcher, worker, [spec_path, result_path], log_file, spec.timeout_s
        )
        if returncode is None or (returncode == -signal.SIGKILL and waited >= spec.timeout_s):
            # (the second: the worker's own watchdog ended it at its deadline, before we could)
            result = ProbeResult.failed(
                spec,
                Outcome.TIMEOUT,
                f"the probe ran past timeout_s={spec.timeout_s:g} and was killed",
                log_tail(log_file),
            )
        else:
            result = _read_result(spec, result_path, returncode, log_file)
    result.wall_s = time.perf_counter() - started
    log.debug("probe %s -> %s in %.1f s", spec.knobs, result.outcome.value, result.wall_s)
    return result


def run_retried(
    spec: ProbeSpec, launcher: Launcher | None, worker: str, paths: list[Path], log_file: Path,
    timeout_s: float,
) -> tuple[int | None, float]:  # fmt: skip
    """`_run`, once more on a fresh server when the fork server died under the first."""
    # Settings read from the environment as torch starts (the CUDA allocator's) go into the
    # worker's environment, not the spec: by the time the worker reads its spec, torch is
    # imported.
    env = worker_environment(spec.knobs.get("allocator", "default"))
    for attempt in range(2):
        try:
            return _run(
                launcher or SpawnLauncher(), worker, [str(p) for p in paths], log_file, env,
                timeout_s,
            )  # fmt: skip
        except ServerDied as exc:
            if attempt:
                raise ProbeNotFinished(
                    f"the probe of {spec.knobs} did not finish: {exc}, twice; "
                    "rerun the same command to measure it again"
                ) from None
            log.warning("probe %s: %s; trying it once more on a new server", spec.knobs, exc)
    raise AssertionError("unreachable")


def _run(
    launcher: Launcher, worker: str, args: list[str], log_file: Path, env: dict[str, str],
    timeout_s: float,
) -> tuple[int | None, float]:  # fmt: skip
    """Start the worker and wait for it: its exit code (None: killed at the timeout) and the
    seconds waited."""
    started = time.perf_counter()
    proc = launcher.start(worker, args, log_file, env, timeout_s)
    try:
        returncode = proc.wait(timeout=timeout_s)
    except BaseException:  # an interrupt in this thread, or the launcher stopped under it
        proc.kill_group()
        raise
    if returncode is None:
        proc.kill_group()
    return returncode, time.perf_counter() - started


def _read_result(spec: ProbeSpec, path: Path, returncode: int, log_file: Path) -> ProbeResult:
    if path.exists():
        try:
            return ProbeResult.from_json(path.read_text())
        except (ValueError, KeyError, TypeError) as exc:
            return ProbeResult.failed(
                spec,
                Outcome.CRASH,
                f"the probe worker wrote an unreadable result: {exc}",
                log_tail(log_file),
            )
    return ProbeResult.failed(spec, Outcome.CRASH, describe_exit(returncode), log_tail(log_file))
