"""A search's progress as it goes, on stderr: one line kept up to date on a terminal, a log line
per probe otherwise, and never silent for long (`autofit search`'s display)."""

from __future__ import annotations

import shutil
import threading
import time
from typing import TextIO

from autofit.records.probe import Outcome, ProbeResult
from autofit.records.status import Status
from autofit.search.combination import Combination
from autofit.search.display import config_words
from autofit.search.engine import SearchListener
from autofit.search.pareto import fastest_and_best
from autofit.search.space import SearchSpace
from autofit.units import many, resolution_words, size

# The longest a search's progress stays silent: a line at least this often, on a terminal or not.
QUIET_S = 20.0


class Progress(SearchListener):
    """Combinations left with an estimate of the time left, probes done, the current best with
    its peak against the budget: one line kept up to date on a terminal (numbers first; only
    the best's knob words are cut to the terminal's width), a plain log line per probe
    otherwise. Never silent for long: when nothing was written for `quiet_s` seconds (a long
    trace, a large model's first probe), a line says what the workers are on and how far the
    search is, on a terminal and in a log alike."""

    def __init__(
        self,
        stream: TextIO,
        space: SearchSpace,
        knob_names: list[str],
        width: int | None = None,
        quiet_s: float = QUIET_S,
        unit: str = "pixels",
    ) -> None:
        self.stream = stream
        self.unit = unit  # the model's: a language model's resolution is tokens
        self.live = stream.isatty()
        self.space, self.knob_names = space, knob_names
        self.width = width or shutil.get_terminal_size((160, 24)).columns
        self.started = time.perf_counter()
        self.done = self.reused = 0
        self.runnable: int | None = None  # combinations to search, once the invalid are known
        self.concluded = 0  # of those, answered (or pruned)
        self._fitting: list[ProbeResult] = []  # at the target, for the best so far
        self.best: ProbeResult | None = None
        self._invalid: dict[str, int] = {}  # reason -> combinations, logged as one line each
        self._lock = threading.Lock()
        self._working: dict[str, int] = {}  # what the workers are on (label -> workers)
        self._written = time.perf_counter()  # when the stream was last written to
        self._stop = threading.Event()
        self._quiet_s = quiet_s
        self._beat = threading.Thread(target=self._heartbeat, name="progress", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self._quiet_s / 4)):
            with self._lock:
                if time.perf_counter() - self._written < self._quiet_s:
                    continue
                if self.live:
                    self._show()
                else:
                    self._line(f"working on {self._work_words()}; {self._left()}")

    def _work_words(self) -> str:
        if not self._working:
            return "the next combinations"
        labels = list(self._working)
        more = f" (and {len(labels) - 1} more)" if len(labels) > 1 else ""
        return labels[0] + more

    def _line(self, text: str) -> None:
        """One log line, stamped with the time since the start (off a terminal)."""
        self.stream.write(f"[{self._elapsed()}] {text}\n")
        self.stream.flush()
        self._written = time.perf_counter()

    def on_work(self, label: str, started: bool) -> None:
        with self._lock:
            count = self._working.get(label, 0) + (1 if started else -1)
            if count > 0:
                self._working[label] = count
            else:
                self._working.pop(label, None)

    def _elapsed(self) -> str:
        return _clock(time.perf_counter() - self.started)

    def _left(self) -> str:
        """Combinations left, and the time they would take at the pace so far."""
        if self.runnable is None:
            return "checking combinations"
        left = self.runnable - self.concluded
        words = f"{self.concluded}/{self.runnable} combinations done"
        if self.concluded and left:
            seconds = (time.perf_counter() - self.started) / self.concluded * left
            words += f", about {_clock(seconds)} left"
        return words

    def _best_figures(self) -> str:
        best = self.best
        if best is None:
            return "none yet"
        return (
            f"b={best.config['batch_size']} {best.samples_per_s:.2f} samples/s, "
            f"{size(best.peak_bytes)} of {size(best.budget_bytes)}"
        )

    def status(self) -> str:
        """The live line: every number whole; the best's knobs fill what the width leaves."""
        numbers = (
            f"{self._left()} | {many(self.done, 'probe')} ({self.reused} reused) | {self._elapsed()} | "
            f"best at {resolution_words(self.space.target_resolution, self.unit)}: "
            f"{self._best_figures()}"
        )
        words = config_words(self.best, self.knob_names) if self.best else ""
        room = self.width - 1 - len(numbers) - 1
        if words and room > 3:
            numbers += " " + (words if len(words) <= room else words[: room - 3] + "...")
        return numbers

    def on_start(self, runnable: int) -> None:
        with self._lock:
            self.runnable = runnable

    def on_probe(self, result: ProbeResult, reused: bool) -> None:
        with self._lock:
            self.done += 1
            self.reused += reused
            config = result.config
            if result.outcome is Outcome.OK:
                self._fitting.append(result)
                space = self.space
                self.best = fastest_and_best(
                    self._fitting, space.target_resolution, space.target_min_batch,
                    space.best_rule,
                )[1]  # fmt: skip
            if self.live:
                self._show()
            else:
                self._log_invalid()
                knobs = config_words(result, self.knob_names)
                peak = size(result.peak_bytes) if result.peak_bytes else "-"
                if result.host_peak_bytes is not None:
                    peak += f" (host {size(result.host_peak_bytes)})"
                speed = f"{result.samples_per_s:.2f} samples/s" if result.samples_per_s else ""
                source = "reused" if reused else f"{result.wall_s or 0:.1f} s"
                self._line(
                    f"probe {self.done}: {knobs} batch={config['batch_size']} "
                    f"res={config['resolution']} -> {result.outcome.value} {peak} {speed} ({source}); "
                    f"{self._left()}"
                )

    def _show(self) -> None:
        self.stream.write("\r" + self.status().ljust(self.width - 1))
        self.stream.flush()
        self._written = time.perf_counter()

    def on_combination(self, combination: Combination) -> None:
        with self._lock:
            if combination.status is not Status.INVALID:
                self.concluded += 1
            if self.live:
                self._show()
                return
            if combination.status is Status.INVALID:
                # the search finds them all before its first probe: one line per reason
                self._invalid[combination.reason] = self._invalid.get(combination.reason, 0) + 1
            elif combination.status is Status.PRUNED:
                self._log_invalid()
                self._line(
                    f"{combination.status.value}: {combination.label()}: {combination.reason}"
                )

    def _log_invalid(self) -> None:
        for reason, count in self._invalid.items():
            self._line(f"invalid: {count} combinations: {reason}")
        self._invalid.clear()

    def close(self) -> None:
        self._stop.set()
        self._beat.join()
        with self._lock:
            if self.live:
                self.stream.write("\n")
            else:
                self._log_invalid()
            self.stream.flush()


def _clock(seconds: float) -> str:
    """mm:ss, or h:mm:ss past an hour."""
    seconds = int(seconds)
    hours, minutes = divmod(seconds // 60, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{seconds % 60:02d}"
    return f"{minutes:02d}:{seconds % 60:02d}"
