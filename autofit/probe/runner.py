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

import dataclasses
import json
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
from autofit.probe.scan import at_batch
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec, ScanResult, ScanWindow

log = logging.getLogger(__name__)

WORKER = "autofit.probe.worker"
SCAN_WORKER = "autofit.probe.scan"
SCAN_TRACES = 4  # a structure's at most: three for its curve, and batch 1 by itself
LOG_TAIL_CHARS = 4000


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL_CHARS:].decode("utf-8", errors="replace")


def _describe_exit(returncode: int) -> str:
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
        returncode, waited = _run_retried(
            spec, launcher, worker, [spec_path, result_path], log_file, spec.timeout_s
        )
        if returncode is None or (returncode == -signal.SIGKILL and waited >= spec.timeout_s):
            # (the second: the worker's own watchdog ended it at its deadline, before we could)
            result = ProbeResult.failed(
                spec,
                Outcome.TIMEOUT,
                f"the probe ran past timeout_s={spec.timeout_s:g} and was killed",
                _tail(log_file),
            )
        else:
            result = _read_result(spec, result_path, returncode, log_file)
    result.wall_s = time.perf_counter() - started
    log.debug("probe %s -> %s in %.1f s", spec.knobs, result.outcome.value, result.wall_s)
    return result


def run_scans(
    items: list[tuple[ProbeSpec, int]],
    hi: int,
    launcher: Launcher | None = None,
    window: ScanWindow | None = None,
    updates_dir: Path | None = None,
) -> list[ScanResult]:
    """Scan structures (each a spec and the smallest batch `lo` of its range `lo`..`hi`) in one
    subprocess (autofit/probe/scan.py `scan_group`; `window`: the batches the best rule weighs;
    `updates_dir`: where scans of one search share setup-and-update traces,
    autofit/probe/shared_updates.py). Each structure traces at most four
    batches, so the scans may take four times a probe's `timeout_s` each; scans that run past
    that, or whose worker dies, come back with no curve and one result saying so, at their
    `lo`. Raises ProbeNotFinished as `run_probe` does."""
    started = time.perf_counter()
    first = items[0][0]
    timeout_s = SCAN_TRACES * len(items) * first.timeout_s
    with tempfile.TemporaryDirectory(prefix="autofit-scan-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        log_file = Path(tmp) / "worker.log"
        structures = [{"spec": dataclasses.asdict(spec), "lo": lo} for spec, lo in items]
        request_path.write_text(
            json.dumps(
                {
                    "structures": structures,
                    "hi": hi,
                    "window": dataclasses.asdict(window) if window else None,
                    "updates_dir": str(updates_dir) if updates_dir else None,
                }
            )  # fmt: skip
        )
        returncode, waited = _run_retried(
            first, launcher, SCAN_WORKER, [request_path, result_path], log_file, timeout_s
        )
        if returncode is None or (returncode == -signal.SIGKILL and waited >= timeout_s):
            outcome, reason = Outcome.TIMEOUT, f"the scans ran past {timeout_s:g} s and were killed"
        elif result_path.exists():
            outcome, reason = None, ""
        else:
            outcome, reason = Outcome.CRASH, _describe_exit(returncode)
        if outcome is None:
            answers = [ScanResult.from_dict(a) for a in json.loads(result_path.read_text())]
        else:
            tail = _tail(log_file)
            answers = [
                ScanResult(lo, hi, None, [ProbeResult.failed(
                    at_batch(spec, lo),
                    outcome, reason, tail,
                )], [], False, reason)
                for spec, lo in items
            ]  # fmt: skip
    wall_s = time.perf_counter() - started
    points = sum(len(answer.results) for answer in answers)
    for answer in answers:
        for result in answer.results:
            result.wall_s = wall_s / max(1, points)
    return answers


def _run_retried(
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
                _tail(log_file),
            )
    return ProbeResult.failed(spec, Outcome.CRASH, _describe_exit(returncode), _tail(log_file))
