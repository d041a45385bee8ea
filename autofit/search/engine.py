"""The search: for every structural combination and resolution, the largest batch that fits.

Combinations run in waves by how many memory-saving-at-a-speed-cost settings they use (gradient
checkpointing on, say): a saver is worth probing only at batches its faster parent (the same
combination without it) cannot fit, so its search starts just above the parent's largest batch,
and it is pruned, with the reason recorded, when that batch does not fit or the parent already
fits the space's largest. Combinations that cannot run on the GPU at all are recorded as invalid.
Combinations are searched concurrently (`jobs`), each as soon as its parents have their answers
(the rest of their wave may still run), those at the head of the longest chains of waiting
combinations first (`_GroupQueue`). Simulated ones are scanned: the
combinations of a wave whose per-sample memory is the same (they differ in the optimizer, say)
go to one subprocess, which answers each for every batch from batch curves (autofit/probe/scan.py)
and reports the largest that fits; the others, and simulated ones whose step is not affine in the
batch, are searched by the planner, probe by probe, with estimates of the memory per sample
shared between combinations whose per-sample memory is the same. Other
workers may share the study: a combination whose next probe one of them is running is set aside
and taken up again once the others are started, so each worker probes what no other is probing.
Last, where the best rule (autofit/search/pareto.py) may prefer a lighter run than the fastest,
the search probes each combination's lightest run as fast as the rule's floor that no scan
reported (`_unweighed`, `_weigh`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from autofit.errors import AutofitError
from autofit.knobs import REGISTRY, invalid_reason
from autofit.probe.shared_updates import update_knobs
from autofit.probe.spec import Outcome, ProbeResult, ScanResult, ScanWindow
from autofit.results import Status
from autofit.search.claims import POLL_S, Busy
from autofit.search.pareto import fastest_and_best, pareto_front
from autofit.search.planner import LargestBatch, Observation, largest_fitting_batch
from autofit.search.prober import Prober
from autofit.search.space import SearchSpace
from autofit.units import value as show

log = logging.getLogger(__name__)


@dataclass
class Combination:
    """One structural combination at one resolution, and what its search found."""

    knobs: dict[str, Any]  # the searched knobs' values
    resolution: int
    status: Status = Status.PENDING
    best_batch: int | None = None
    probes: int = 0
    reason: str = ""

    def label(self) -> str:
        return " ".join(f"{k}={show(v)}" for k, v in self.knobs.items()) + f" @{self.resolution}px"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "status": self.status.value}


class SearchListener:
    """Hears about the search as it goes; the CLI's progress display subclasses it."""

    def on_probe(self, result: ProbeResult, reused: bool) -> None:
        pass

    def on_combination(self, combination: Combination) -> None:
        pass

    def on_start(self, runnable: int) -> None:
        """The invalid combinations are known (each heard of); `runnable` are left to search."""


@dataclass
class SearchResult:
    results: list[ProbeResult]  # every probe this search used, run now or reused from the study
    combinations: list[Combination]
    new_probes: int
    reused_probes: int
    wall_s: float
    budget_bytes: int
    pareto: dict[int, list[ProbeResult]] = field(default_factory=dict)
    best: ProbeResult | None = None  # by the space's BestRule
    fastest: ProbeResult | None = None  # the fastest fitting run, when the rule preferred another


def _savings(knobs: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """The knobs set to a memory-saving value, each with the faster value it saves over."""
    found = {}
    for name, knob in REGISTRY.items():
        if name in knobs:
            baseline = knob.saves_memory_over(knobs[name], space.knobs.get(name, ()))
            if baseline is not None:
                found[name] = baseline
    return found


def _parents(knobs: dict[str, Any], space: SearchSpace) -> list[dict[str, Any]]:
    """The knobs with one memory-saving setting back at the faster value it saves over."""
    return [{**knobs, name: baseline} for name, baseline in _savings(knobs, space).items()]


def _hint_key(knobs: dict[str, Any], resolution: int) -> tuple[Any, ...]:
    per_sample = {name for name, knob in REGISTRY.items() if knob.per_sample_memory}
    return (resolution, tuple(sorted((k, v) for k, v in knobs.items() if k in per_sample)))


class Search:
    def __init__(
        self,
        space: SearchSpace,
        prober: Prober,
        jobs: int = 1,
        listener: SearchListener | None = None,
        left_out: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        """`left_out`, when given, says why the search leaves a configuration out (every knob's
        value, the resolution included): the trainer the user asked for cannot launch it, or
        another value of the space does the same for less; such combinations are invalid, as
        those that cannot run at all."""
        self.space, self.prober = space, prober
        self.left_out = left_out or (lambda knobs: None)
        self.preset, self.gpu, self.budget = prober.preset, prober.gpu, prober.budget
        self.jobs = max(1, jobs)
        # whether the prober answers structures for every batch at once (Prober.scans)
        self.scans = bool(getattr(prober, "scans", False))
        self.listener = listener or SearchListener()
        self._lock = threading.Lock()
        self._results: list[ProbeResult] = []
        self._new = self._reused = 0
        self._slopes: dict[tuple[Any, ...], dict[str, float]] = {}
        self._best: dict[tuple[Any, ...], int | None] = {}  # (knobs, resolution) -> b*
        self._over_host: set[tuple[Any, ...]] = set()  # (knobs, resolution, batch): oom_host
        self._observed: dict[tuple[Any, ...], Observation] = {}  # (knobs, resolution, batch)
        # (knobs, resolution) -> the floor of the window a scan reported whole (ScanWindow)
        self._windows: dict[tuple[Any, ...], float] = {}

    # -- probing -------------------------------------------------------------------------------

    def _probe(self, combination: Combination) -> Callable[[int], Observation]:
        def probe(batch: int) -> Observation:
            point = (_frozen(combination.knobs), combination.resolution, batch)
            seen = self._observed.get(point)
            if seen is not None:  # a combination searched again after `Busy`: already counted
                return seen
            result, reused = self.prober(
                {**combination.knobs, "batch_size": batch, "resolution": combination.resolution}
            )
            with self._lock:
                self._results.append(result)
                if reused:
                    self._reused += 1
                else:
                    self._new += 1
            combination.probes += 1
            if result.outcome is Outcome.OOM_HOST:
                with self._lock:
                    self._over_host.add(point)
            self.listener.on_probe(result, reused)
            observation = self._observed[point] = Observation.of(batch, result)
            return observation

        return probe

    # -- one combination -----------------------------------------------------------------------

    def _floor(self, combination: Combination) -> tuple[int, str, dict[str, Any]] | None:
        """The batch below which the combination need not look (its faster parents fit up to
        it), why, and its memory-saving settings; None when it is pruned (a parent already fits
        the space's largest batch)."""
        knobs, resolution = combination.knobs, combination.resolution
        floor, parent_note = self.space.min_batch - 1, ""
        savings = _savings(knobs, self.space)
        for name, baseline in savings.items():
            parent = {**knobs, name: baseline}
            parent_best = self._best.get((_frozen(parent), resolution)) or 0
            if parent_best > floor:
                floor = parent_best
                parent_note = f"{name}={show(baseline)} already fits batch {parent_best}"
        if savings and floor >= self.space.max_batch:
            self._best[(_frozen(knobs), resolution)] = floor  # it fits what its parent fits
            self._prune(
                combination,
                f"{parent_note}, the space's largest; {_setting(knobs, savings)} would only be slower",
            )
            return None
        return floor, parent_note, savings

    def _search(self, combination: Combination) -> None:
        """Probe batch by batch (the planner): for backends that measure, and structures whose
        simulated step is not affine in the batch."""
        found = self._floor(combination)
        if found is None:
            return
        floor = found[0]
        knobs, resolution = combination.knobs, combination.resolution
        plan = largest_fitting_batch(
            self._probe(combination),
            self.budget,
            self.space.max_batch,
            floor=floor,
            slope_hint=self._slopes.get(_hint_key(knobs, resolution)),
        )
        slopes = plan.slopes()
        if slopes:
            self._slopes.setdefault(_hint_key(knobs, resolution), slopes)
        self._conclude(combination, plan, *found)

    def _search_group(self, group: list[Combination]) -> list[Combination]:
        """Scan a group of combinations that differ only in knobs that do not change what a
        sample adds (one subprocess, one curve lent where the steps agree); those whose traces
        are not affine are probed batch by batch. Returns the combinations another worker is
        scanning now, to come back to."""
        floors = [(c, self._floor(c)) for c in group]
        todo = [(c, found) for c, found in floors if found is not None]
        if not todo:
            return []
        answers = self.prober.scan(
            [({**c.knobs, "resolution": c.resolution}, found[0] + 1) for c, found in todo],
            self.space.max_batch,
            self._scan_window(group[0].resolution),
        )
        busy = []
        for (combination, found), answer in zip(todo, answers, strict=True):
            if answer is None:
                busy.append(combination)
                continue
            plan = self._scanned(combination, *answer)
            if plan is None:
                self._search(combination)
            else:
                self._conclude(combination, plan, *found)
        return busy

    def _conclude(
        self,
        combination: Combination,
        plan: LargestBatch,
        floor: int,
        parent_note: str,
        savings: dict[str, Any],
    ) -> None:
        knobs, resolution = combination.knobs, combination.resolution
        self._best[(_frozen(knobs), resolution)] = plan.best_batch
        if plan.failed is not None:
            combination.status = Status.FAILED
            combination.reason = (
                f"the probe at batch {plan.failed.batch} did not finish (crash or timeout)"
            )
            combination.best_batch = plan.best_batch
        elif plan.best_batch is not None:
            combination.status, combination.best_batch = Status.EXACT, plan.best_batch
        elif parent_note:
            self._best[(_frozen(knobs), resolution)] = floor
            self._prune(
                combination,
                f"{parent_note}, and batch {floor + 1} does not fit with {_setting(knobs, savings)} either",
            )
            return
        else:
            combination.status = Status.NONE_FIT
            combination.reason = f"batch {self.space.min_batch} does not fit"
            if (_frozen(knobs), resolution, self.space.min_batch) in self._over_host:
                combination.reason += " the host memory (oom_host)"
        self.listener.on_combination(combination)

    def _scanned(
        self, combination: Combination, answer: ScanResult, reused: bool
    ) -> LargestBatch | None:
        """The planner's answer from a scan of the combination's batch curve; None when its
        traces do not lie on one line, and the planner must probe batch by batch."""
        if not reused:
            combination.probes += len(answer.traced)
        if answer.window_floor is not None:
            self._windows[(_frozen(combination.knobs), combination.resolution)] = (
                answer.window_floor
            )
        plan = LargestBatch(best_batch=answer.best_batch)
        for result in answer.results:
            batch = result.config["batch_size"]
            with self._lock:
                self._results.append(result)
                self._reused += reused
                self._new += not reused
            if result.outcome is Outcome.OOM_HOST:
                with self._lock:
                    self._over_host.add((_frozen(combination.knobs), combination.resolution, batch))
            self.listener.on_probe(result, reused)
            observation = Observation.of(batch, result)
            self._observed[(_frozen(combination.knobs), combination.resolution, batch)] = (
                observation
            )
            plan.observations.append(observation)
            if observation.fits is None:
                plan.failed = observation
        if plan.failed is None and not answer.affine:
            log.warning("%s: %s; probing it batch by batch", combination.label(), answer.reason)
            return None
        return plan

    # -- the runs the best rule weighs ----------------------------------------------------------

    def _fastest(self) -> ProbeResult | None:
        space = self.space
        with self._lock:
            results = list(self._results)
        return fastest_and_best(results, space.target_resolution, space.target_min_batch)[0]

    def _scan_window(self, resolution: int) -> ScanWindow | None:
        """What scans at `resolution` report for the best rule: at the target resolution, where
        the rule may prefer a lighter run than the fastest, every batch within its tolerance,
        above the floor that the fastest run found so far sets (ScanWindow)."""
        space, rule = self.space, self.space.best_rule
        if resolution != space.target_resolution or not rule.prefers_lighter:
            return None
        floor = rule.floor(self._fastest())
        return ScanWindow(space.target_min_batch, rule.speed_tolerance, floor)

    def _unweighed(self, runnable: list[Combination], floor: float) -> list[Combination]:
        """The combinations at the target resolution that may hold a run the best rule weighs
        (as fast as `floor`) that the search has not looked at: those probed batch by batch,
        those whose window was too wide to report, and those whose scan reported it down to a
        higher floor only (a scan another search stored, whose fastest run was faster), where
        their own fastest run reaches the floor; and those pruned because a parent already fits
        the largest batch, where that parent reaches it (a memory-saving setting costs speed at
        every batch, so it cannot run faster than its parent)."""
        space = self.space
        found = []
        for combination in runnable:
            if combination.resolution != space.target_resolution:
                continue
            key = (_frozen(combination.knobs), combination.resolution)
            if self._windows.get(key, float("inf")) <= floor:
                continue  # its scan reported every batch as fast as the floor
            if combination.status is Status.PRUNED:
                if any(self._reaches(p, floor) for p in _parents(combination.knobs, space)):
                    found.append(combination)
            elif self._reaches(combination.knobs, floor):
                found.append(combination)
        return found

    def _reaches(self, knobs: dict[str, Any], floor: float) -> bool:
        """Whether a fitting run of these knobs at the target resolution runs as fast as `floor`."""
        frozen, resolution = _frozen(knobs), self.space.target_resolution
        with self._lock:
            seen = [o for (k, r, _), o in self._observed.items() if k == frozen and r == resolution]
        return any(o.fits and (o.samples_per_s or 0.0) >= floor for o in seen)

    def _weigh(self, combination: Combination, floor: float) -> list[Combination]:
        """Probe the combination for the run the best rule weighs for it, of its runs as fast as
        `floor` the one that holds the least (the faster of equal ones), by bisection below its
        largest batch: a roofline step's time per sample does not grow with the batch, so the
        runs as fast are the batches from the least that is up; and the memory a step holds
        does not fall as its batch grows, so the one that holds the least is the largest batch
        that holds what that least one does. Probes already made are not made again."""
        probe = self._probe(combination)
        key = (_frozen(combination.knobs), combination.resolution)
        top = self._best.get(key) or self.space.max_batch  # a pruned one: its parent's

        def fast(batch: int) -> bool:  # a batch that does not fit says to look lower
            seen = probe(batch)
            return not seen.fits or (seen.samples_per_s or 0.0) >= floor

        if not fast(top):
            return []
        least = _first_true(fast, self.space.target_min_batch, top)
        while least < top and not probe(least).fits:  # the least that also fits
            least += 1
        peak = probe(least).peak_bytes or 0

        def heavier(batch: int) -> bool:
            seen = probe(batch)
            return not seen.fits or (seen.peak_bytes or 0) > peak

        if heavier(top):
            _first_true(heavier, least + 1, top)
        return []

    def _prune(self, combination: Combination, reason: str) -> None:
        combination.status, combination.reason = Status.PRUNED, reason
        self.prober.recorder.record_pruned(
            {**combination.knobs, "resolution": combination.resolution}, reason
        )
        self.listener.on_combination(combination)

    # -- the whole search ----------------------------------------------------------------------

    def combinations(self) -> list[Combination]:
        return [
            Combination(dict(knobs), resolution)
            for resolution in self.space.resolutions
            for knobs in self.space.combinations()
        ]

    def run(self) -> SearchResult:
        started = time.perf_counter()
        # The launcher's imports (a fork server's: torch and the model's library, seconds) run
        # while the space is checked and the combinations left out are recorded.
        warm = getattr(self.prober, "warm", None)
        if warm is not None:
            warm()
        combinations = self.combinations()
        runnable: list[Combination] = []
        invalid: list[tuple[dict[str, Any], str]] = []
        for combination in combinations:
            knobs = {
                **self.prober.defaults,
                **combination.knobs,
                "resolution": combination.resolution,
            }
            reason = invalid_reason(
                knobs, self.gpu, self.preset, self.prober.backend
            ) or self.left_out(knobs)
            if reason:
                combination.status, combination.reason = Status.INVALID, reason
                knobs = {**combination.knobs, "resolution": combination.resolution}
                invalid.append((knobs, f"invalid: {reason}"))
                self.listener.on_combination(combination)
            else:
                runnable.append(combination)
        self.prober.recorder.record_pruned_all(invalid)
        if not runnable:
            raise AutofitError(_nothing_to_search(combinations, self.space.name))
        self.listener.on_start(len(runnable))
        # In waves by how many memory-saving settings a combination has: those with fewer
        # first, as their answers set the others' floors. A group starts as soon as its
        # parents have their answers (`_parents_answered`), not when the whole wave before it
        # is done: the last combinations of a wave run beside the next one's.
        waves: dict[int, list[Combination]] = defaultdict(list)
        for combination in runnable:
            waves[len(_savings(combination.knobs, self.space))].append(combination)
        searched = {(_frozen(c.knobs), c.resolution) for c in runnable}
        groups = [group for size in sorted(waves) for group in self._groups(waves[size])]
        search = self._search_group if self.scans else self._search_one
        ready = lambda group: self._parents_answered(group, searched)  # noqa: E731
        heights = _heights(groups, self.space)
        target = self.space.target_resolution
        self._run(_GroupQueue(groups, ready, heights, _shared_updates, target), search)
        space = self.space
        if space.best_rule.prefers_lighter:
            # The runs the best rule weighs that the search has not seen: every batch as fast
            # as the floor the fastest run sets, of each combination that may hold one.
            floor = space.best_rule.floor(self._fastest())
            weigh = self._unweighed(runnable, floor)
            self._run(_GroupQueue([[c] for c in weigh]), lambda g: self._weigh(g[0], floor))
        results = list(self._results)
        fastest, best = fastest_and_best(
            results, space.target_resolution, space.target_min_batch, space.best_rule
        )
        return SearchResult(
            results=results,
            combinations=combinations,
            new_probes=self._new,
            reused_probes=self._reused,
            wall_s=time.perf_counter() - started,
            budget_bytes=self.budget,
            pareto=pareto_front(results),
            fastest=fastest if fastest is not best else None,
            best=best,
        )

    def _groups(self, wave: list[Combination]) -> list[list[Combination]]:
        """A wave's combinations in the groups searched together, in the order to search them."""
        if self.scans:
            # Combinations that share what a sample adds are scanned together, one curve lent.
            groups: dict[tuple[Any, ...], list[Combination]] = defaultdict(list)
            for combination in wave:
                groups[_hint_key(combination.knobs, combination.resolution)].append(combination)
            return list(groups.values())
        # Spread combinations that share a memory-per-sample estimate, so the first of each
        # group finishes (and shares its estimate) before the others start.
        seen: dict[tuple[Any, ...], int] = defaultdict(int)
        order = []
        for combination in wave:
            key = _hint_key(combination.knobs, combination.resolution)
            order.append((seen[key], len(order), combination))
            seen[key] += 1
        return [[c] for _, _, c in sorted(order, key=lambda item: item[:2])]

    def _parents_answered(self, group: list[Combination], searched: set[tuple[Any, ...]]) -> bool:
        """Whether every parent of the group's combinations (the same knobs with one
        memory-saving setting back at the faster value it saves over) that this search looks
        at has its answer, which `_floor` reads."""
        for combination in group:
            for knobs in _parents(combination.knobs, self.space):
                parent = (_frozen(knobs), combination.resolution)
                if parent in searched and parent not in self._best:
                    return False
        return True

    def _search_one(self, group: list[Combination]) -> list[Combination]:
        self._search(group[0])
        return []

    def _run(
        self, queue: _GroupQueue, search: Callable[[list[Combination]], list[Combination]]
    ) -> None:
        """Searches the queue's groups with `search` (which returns the combinations of a group
        another worker is probing now, to come back to), in `jobs` threads."""
        if self.jobs == 1:
            self._work(queue, search)
            return
        pool = ThreadPoolExecutor(self.jobs)
        try:
            for future in [pool.submit(self._work, queue, search) for _ in range(self.jobs)]:
                future.result()
        except BaseException:
            # An interrupt or a failed probe: start no queued combination, and do not wait here
            # for the running ones; the caller stops the launcher, which ends their probes.
            queue.abort()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def _work(
        self, queue: _GroupQueue, search: Callable[[list[Combination]], list[Combination]]
    ) -> None:
        """Searches the queue's combinations one after another. One whose next probe another
        worker is running (`Busy`) is set aside and taken up again later (its probes so far are
        remembered), so this worker probes other combinations meanwhile and waits only when
        every one left is busy elsewhere."""
        while (group := queue.next()) is not None:
            try:
                busy = search(group)
            except Busy:
                queue.later(group, group)
            except BaseException:
                queue.abort()
                raise
            else:
                if busy:
                    queue.later(busy, group)
                else:
                    queue.done(group)


class _GroupQueue:
    """The combinations still to search, in groups searched together, shared by the search's
    threads: those not yet tried first, each once `ready` says so (the groups it waits for have
    their answers); then those set aside as busy, each no sooner than `POLL_S` after.

    Of the groups ready, the first in order, but for three preferences (what keeps both cores
    busy to the end of a search):
    - not one that shares setup-and-update traces (`shared`, autofit/probe/shared_updates.py)
      with a group running now, while no group that traces them has finished: the two would
      trace the same updates at once, each for itself;
    - then the one with the longest chain of groups waiting on it (`heights`): the groups a
      chain holds back can only run one after another, and started last they run alone;
    - then one at the target resolution (`target`), whose scans report the batches the best
      rule weighs, and take the longer for it."""

    def __init__(
        self,
        groups: list[list[Combination]],
        ready: Callable[[list[Combination]], bool] = lambda group: True,
        heights: dict[int, int] | None = None,
        shared: Callable[[list[Combination]], frozenset[Any]] = lambda group: frozenset(),
        target: int | None = None,
    ) -> None:
        self._fresh = deque(groups)
        self._ready = ready
        self._heights = heights or {}  # id(group) -> its chain of waiting groups
        self._shared = shared
        self._target = target  # the target resolution
        self._running: dict[int, frozenset[Any]] = {}  # id(group) -> what it shares
        self._traced: set[Any] = set()  # what finished groups shared
        self._busy: deque[tuple[float, list[Combination]]] = deque()
        self._active = 0  # combinations being searched now: each may be set aside again
        self._aborted = False
        self._changed = threading.Condition()

    def next(self) -> list[Combination] | None:
        """The next group to search; None once every one is done (or the search stopped)."""
        with self._changed:
            while not self._aborted:
                group = self._first_ready()
                if group is not None:
                    return self._start(group)
                if self._busy:
                    due, group = self._busy[0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        self._busy.popleft()
                        return self._start(group)
                    self._changed.wait(wait)
                elif self._active:
                    self._changed.wait()
                elif self._fresh:
                    # Nothing runs that could answer what they wait for: every group before
                    # them is done, so their parents are answered or not searched (as after a
                    # wave); take them in order.
                    return self._start(self._fresh.popleft())
                else:
                    return None
            return None

    def _start(self, group: list[Combination]) -> list[Combination]:
        self._active += 1
        self._running[id(group)] = self._shared(group)
        return group

    def _first_ready(self) -> list[Combination] | None:
        tracing = set().union(*self._running.values()) - self._traced

        def preference(place: int) -> tuple[bool, int, bool, int]:
            group = self._fresh[place]
            waits = bool(self._shared(group) & tracing)
            elsewhere = group[0].resolution != self._target
            return waits, -self._heights.get(id(group), 0), elsewhere, place

        ready = [place for place, group in enumerate(self._fresh) if self._ready(group)]
        if not ready:
            return None
        place = min(ready, key=preference)
        group = self._fresh[place]
        del self._fresh[place]
        return group

    def later(self, group: list[Combination], taken: list[Combination]) -> None:
        """Sets `group` aside, busy (all of `taken`, the group `next` gave, or the part of it
        another worker is searching)."""
        with self._changed:
            self._active -= 1
            self._running.pop(id(taken), None)
            self._busy.append((time.monotonic() + POLL_S, group))
            self._changed.notify_all()

    def done(self, group: list[Combination]) -> None:
        with self._changed:
            self._active -= 1
            self._traced |= self._running.pop(id(group), frozenset())
            self._changed.notify_all()

    def abort(self) -> None:
        with self._changed:
            self._aborted = True
            self._changed.notify_all()


def _heights(groups: list[list[Combination]], space: SearchSpace) -> dict[int, int]:
    """For each group (by id), the longest chain of groups that wait on it: 0 for a group no
    other waits on, else one more than the longest of those that wait on it (a group waits on
    those holding its combinations' parents, `_parents_answered`)."""
    holder = {(_frozen(c.knobs), c.resolution): i for i, g in enumerate(groups) for c in g}
    waiting: list[set[int]] = [set() for _ in groups]
    for index, group in enumerate(groups):
        for combination in group:
            for knobs in _parents(combination.knobs, space):
                parent = holder.get((_frozen(knobs), combination.resolution))
                if parent is not None and parent != index:
                    waiting[parent].add(index)
    heights: dict[int, int] = {}

    def height(index: int) -> int:
        if index not in heights:  # parents have fewer savings: no chain comes back
            heights[index] = max((1 + height(w) for w in waiting[index]), default=0)
        return heights[index]

    return {id(group): height(index) for index, group in enumerate(groups)}


def _shared_updates(group: list[Combination]) -> frozenset[Any]:
    """What a scan of the group traces to share with other scans of the search: the setup and
    updates of each combination after the first (which lends them its pass), as
    autofit/probe/shared_updates.py keys them: the knobs less those that change only the
    pass."""
    return frozenset(tuple(sorted(update_knobs(c.knobs).items())) for c in group[1:])


def _first_true(holds: Callable[[int], bool], low: int, high: int) -> int:
    """The least batch in `low`..`high` for which `holds`, by bisection: it holds at `high` and
    at every batch above the least one."""
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low


def _nothing_to_search(combinations: list[Combination], space: str) -> str:
    """Every combination is invalid: say the commonest reason, and how many others there are."""
    reasons: dict[str, int] = defaultdict(int)
    for combination in combinations:
        reasons[combination.reason] += 1
    ranked = sorted(reasons.items(), key=lambda item: -item[1])
    first, count = ranked[0]
    others = f" (and {len(ranked) - 1} other reasons)" if len(ranked) > 1 else ""
    return (
        f"nothing to search: all {len(combinations)} combinations of space {space} are invalid; "
        f"{count} because {first}{others}; add values that can run to the space (a copy of it, "
        "given as space=path/to/space.yaml)"
    )


def _setting(knobs: dict[str, Any], names: dict[str, Any]) -> str:
    return " and ".join(f"{name}={show(knobs[name])}" for name in names)


def _frozen(knobs: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(knobs.items()))
