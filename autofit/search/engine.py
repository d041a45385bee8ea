"""The search: for every structural combination and resolution, the largest batch that fits.

Combinations run in waves by how many memory-saving-at-a-speed-cost settings they use (gradient
checkpointing on, say): a saver is worth probing only at batches its faster parent (the same
combination without it) cannot fit, so its search starts just above the parent's largest batch,
and it is pruned, with the reason recorded, when that batch does not fit or the parent already
fits the space's largest. Combinations that cannot run on the GPU at all are recorded as invalid.
Combinations are searched concurrently (`jobs`), each as soon as its parents have their answers
(the rest of their wave may still run), those at the head of the longest chains of waiting
combinations first (autofit/fastpath/scheduler.py). Simulated ones are scanned: the
combinations of a wave whose per-sample memory is the same (they differ in the optimizer, say)
go to one subprocess, which answers each for every batch from batch curves (autofit/fastpath/scan.py)
and reports the largest that fits; the others, and simulated ones whose step is not affine in the
batch, are searched by the planner, probe by probe, with estimates of the memory per sample
shared between combinations whose per-sample memory is the same. Other
workers may share the study: a combination whose next probe one of them is running is set aside
and taken up again once the others are started, so each worker probes what no other is probing.
Last, where the best rule (autofit/search/pareto.py) may prefer a lighter run than the fastest,
the search probes each combination's lightest run as fast as the rule's floor that no scan
reported (autofit/search/weighing.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autofit.errors import NothingToSearch
from autofit.fastpath.grouping import search_groups
from autofit.fastpath.scheduler import GroupQueue, chain_heights, run_groups, shared_updates
from autofit.knobs import invalid_reason
from autofit.records.probe import Outcome, ProbeResult, ScanResult
from autofit.records.status import Status
from autofit.search.combination import (
    Combination,
    frozen,
    hint_key,
    memory_savings,
    parents,
    setting_words,
)
from autofit.search.pareto import fastest_and_best, pareto_front
from autofit.search.planner import LargestBatch, Observation, largest_fitting_batch
from autofit.search.prober import Prober
from autofit.search.space import SearchSpace
from autofit.search.weighing import scan_window, unweighed, weigh
from autofit.units import value as show

log = logging.getLogger(__name__)


class SearchListener:
    """Hears about the search as it goes; the CLI's progress display subclasses it."""

    def on_probe(self, result: ProbeResult, reused: bool) -> None:
        pass

    def on_combination(self, combination: Combination) -> None:
        pass

    def on_start(self, runnable: int) -> None:
        """The invalid combinations are known (each heard of); `runnable` are left to search."""

    def on_work(self, label: str, started: bool) -> None:
        """A worker started (or ended) tracing or probing what `label` says."""


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
            point = (frozen(combination.knobs), combination.resolution, batch)
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
        savings = memory_savings(knobs, self.space)
        for name, baseline in savings.items():
            parent = {**knobs, name: baseline}
            parent_best = self._best.get((frozen(parent), resolution)) or 0
            if parent_best > floor:
                floor = parent_best
                parent_note = f"{name}={show(baseline)} already fits batch {parent_best}"
        if savings and floor >= self.space.max_batch:
            self._best[(frozen(knobs), resolution)] = floor  # it fits what its parent fits
            self._prune(
                combination,
                f"{parent_note}, the space's largest; {setting_words(knobs, savings)} would only be slower",
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
            slope_hint=self._slopes.get(hint_key(knobs, resolution)),
        )
        slopes = plan.slopes()
        if slopes:
            self._slopes.setdefault(hint_key(knobs, resolution), slopes)
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
            scan_window(self.space, group[0].resolution, self._fastest),
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
        self._best[(frozen(knobs), resolution)] = plan.best_batch
        if plan.failed is not None:
            combination.status = Status.FAILED
            combination.reason = (
                f"the probe at batch {plan.failed.batch} did not finish (crash or timeout)"
            )
            combination.best_batch = plan.best_batch
        elif plan.best_batch is not None:
            combination.status, combination.best_batch = Status.EXACT, plan.best_batch
        elif parent_note:
            self._best[(frozen(knobs), resolution)] = floor
            self._prune(
                combination,
                f"{parent_note}, and batch {floor + 1} does not fit with {setting_words(knobs, savings)} either",
            )
            return
        else:
            combination.status = Status.NONE_FIT
            combination.reason = f"batch {self.space.min_batch} does not fit"
            if (frozen(knobs), resolution, self.space.min_batch) in self._over_host:
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
            self._windows[(frozen(combination.knobs), combination.resolution)] = answer.window_floor
        plan = LargestBatch(best_batch=answer.best_batch)
        for result in answer.results:
            batch = result.config["batch_size"]
            with self._lock:
                self._results.append(result)
                self._reused += reused
                self._new += not reused
            if result.outcome is Outcome.OOM_HOST:
                with self._lock:
                    self._over_host.add((frozen(combination.knobs), combination.resolution, batch))
            self.listener.on_probe(result, reused)
            observation = Observation.of(batch, result)
            self._observed[(frozen(combination.knobs), combination.resolution, batch)] = observation
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

    def _reaches(self, knobs: dict[str, Any], floor: float) -> bool:
        """Whether a fitting run of these knobs at the target resolution runs as fast as `floor`."""
        key, resolution = frozen(knobs), self.space.target_resolution
        with self._lock:
            seen = [o for (k, r, _), o in self._observed.items() if k == key and r == resolution]
        return any(o.fits and (o.samples_per_s or 0.0) >= floor for o in seen)

    def _weigh(self, combination: Combination, floor: float) -> list[Combination]:
        """Probe the combination for the run the best rule weighs for it (`weigh`), below its
        largest batch (a pruned one's: its parent's)."""
        probe = self._probe(combination)
        top = self._best.get((frozen(combination.knobs), combination.resolution))
        weigh(probe, top or self.space.max_batch, self.space.target_min_batch, floor)
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
            Combination(dict(knobs), resolution, unit=self.preset.unit)
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
            raise NothingToSearch(_nothing_to_search(combinations, self.space.name))
        self.listener.on_start(len(runnable))
        # In waves by how many memory-saving settings a combination has: those with fewer
        # first, as their answers set the others' floors. A group starts as soon as its
        # parents have their answers (`_parents_answered`), not when the whole wave before it
        # is done: the last combinations of a wave run beside the next one's.
        waves: dict[int, list[Combination]] = defaultdict(list)
        for combination in runnable:
            waves[len(memory_savings(combination.knobs, self.space))].append(combination)
        searched = {(frozen(c.knobs), c.resolution) for c in runnable}
        groups = [
            group for size in sorted(waves) for group in search_groups(waves[size], self.scans)
        ]
        search = self._search_group if self.scans else self._search_one
        ready = lambda group: self._parents_answered(group, searched)  # noqa: E731
        heights = chain_heights(groups, self.space)
        target = self.space.target_resolution
        queue = GroupQueue(groups, ready, heights, shared_updates, target)
        run_groups(queue, self._announced(search, ""), self.jobs)
        space = self.space
        if space.best_rule.prefers_lighter:
            # The runs the best rule weighs that the search has not seen: every batch as fast
            # as the floor the fastest run sets, of each combination that may hold one.
            fastest = self._fastest()
            floor = space.best_rule.floor(fastest)
            clip = fastest.config.get("frames") if fastest else None
            to_weigh = unweighed(runnable, floor, space, self._windows, self._reaches, clip)
            weigh = self._announced(lambda g: self._weigh(g[0], floor), "weighing ")
            run_groups(GroupQueue([[c] for c in to_weigh]), weigh, self.jobs)
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

    def _announced(
        self, search: Callable[[list[Combination]], Any], doing: str
    ) -> Callable[[list[Combination]], Any]:
        """`search` with the listener told what each group is while a worker is on it."""

        def run(group: list[Combination]) -> Any:
            more = f" and {len(group) - 1} sharing its pass" if len(group) > 1 else ""
            label = doing + group[0].label() + more
            self.listener.on_work(label, True)
            try:
                return search(group)
            finally:
                self.listener.on_work(label, False)

        return run

    def _parents_answered(self, group: list[Combination], searched: set[tuple[Any, ...]]) -> bool:
        """Whether every parent of the group's combinations (the same knobs with one
        memory-saving setting back at the faster value it saves over) that this search looks
        at has its answer, which `_floor` reads."""
        for combination in group:
            for knobs in parents(combination.knobs, self.space):
                parent = (frozen(knobs), combination.resolution)
                if parent in searched and parent not in self._best:
                    return False
        return True

    def _search_one(self, group: list[Combination]) -> list[Combination]:
        self._search(group[0])
        return []


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
