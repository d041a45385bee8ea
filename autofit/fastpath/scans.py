"""The parent side of a scan: the structures of one group answered in one subprocess
(autofit/fastpath/scan.py, the child), with a result for each however the child ends.

The process is a probe's (autofit/probe/runner.py): started by the search's launcher, killed as a
group at its deadline, retried once on a fresh fork server; what differs is the request (many
structures and a batch range) and the answer (a `ScanResult` per structure).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import tempfile
import time
from pathlib import Path

from autofit.probe.launcher import Launcher
from autofit.probe.runner import describe_exit, log_tail, run_retried
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec, ScanResult, ScanWindow

SCAN_WORKER = "autofit.fastpath.scan"
SCAN_TRACES = 4  # a structure's at most: three for its curve, and batch 1 by itself


def run_scans(
    items: list[tuple[ProbeSpec, int]],
    hi: int,
    launcher: Launcher | None = None,
    window: ScanWindow | None = None,
    updates_dir: Path | None = None,
) -> list[ScanResult]:
    """Scan structures (each a spec and the smallest batch `lo` of its range `lo`..`hi`) in one
    subprocess (autofit/fastpath/scan.py `scan_group`; `window`: the batches the best rule weighs;
    `updates_dir`: where scans of one search share setup-and-update traces,
    autofit/fastpath/shared_updates.py). Each structure traces at most four
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
        returncode, waited = run_retried(
            first, launcher, SCAN_WORKER, [request_path, result_path], log_file, timeout_s
        )
        if returncode is None or (returncode == -signal.SIGKILL and waited >= timeout_s):
            outcome, reason = Outcome.TIMEOUT, f"the scans ran past {timeout_s:g} s and were killed"
        elif result_path.exists():
            outcome, reason = None, ""
        else:
            outcome, reason = Outcome.CRASH, describe_exit(returncode)
        if outcome is None:
            answers = [ScanResult.from_dict(a) for a in json.loads(result_path.read_text())]
        else:
            tail = log_tail(log_file)
            answers = [
                ScanResult(lo, hi, None, [ProbeResult.failed(
                    spec.at_batch(lo),
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
