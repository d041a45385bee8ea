"""The order in which the search's threads take up combinations: a queue of the groups still to
search, shared by `jobs` threads, that starts each group once its parents have their answers,
those at the head of the longest chains of waiting groups first, and sets aside a group another
worker is probing (`Busy`) to take it up again later."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from autofit.fastpath.update_keys import update_knobs
from autofit.search.claims import POLL_S, Busy
from autofit.search.combination import Combination, frozen, parents
from autofit.search.space import SearchSpace

# Searches a group; returns the combinations of it another worker is probing now, to come back to.
GroupSearch = Callable[[list[Combination]], list[Combination]]


class GroupQueue:
    """The combinations still to search, in groups searched together, shared by the search's
    threads: those not yet tried first, each once `ready` says so (the groups it waits for have
    their answers); then those set aside as busy, each no sooner than `POLL_S` after.

    Of the groups ready, the first in order, but for three preferences (what keeps both cores
    busy to the end of a search):
    - not one that shares setup-and-update traces (`shared`, autofit/fastpath/shared_updates.py)
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


def chain_heights(groups: list[list[Combination]], space: SearchSpace) -> dict[int, int]:
    """For each group (by id), the longest chain of groups that wait on it: 0 for a group no
    other waits on, else one more than the longest of those that wait on it (a group waits on
    those holding its combinations' parents, `Search._parents_answered`)."""
    holder = {(frozen(c.knobs), c.resolution): i for i, g in enumerate(groups) for c in g}
    waiting: list[set[int]] = [set() for _ in groups]
    for index, group in enumerate(groups):
        for combination in group:
            for knobs in parents(combination.knobs, space):
                parent = holder.get((frozen(knobs), combination.resolution))
                if parent is not None and parent != index:
                    waiting[parent].add(index)
    heights: dict[int, int] = {}

    def height(index: int) -> int:
        if index not in heights:  # parents have fewer savings: no chain comes back
            heights[index] = max((1 + height(w) for w in waiting[index]), default=0)
        return heights[index]

    return {id(group): height(index) for index, group in enumerate(groups)}


def shared_updates(group: list[Combination]) -> frozenset[Any]:
    """What a scan of the group traces to share with other scans of the search: the setup and
    updates of each combination after the first (which lends them its pass), as
    autofit/fastpath/shared_updates.py keys them: the knobs less those that change only the
    pass."""
    return frozenset(tuple(sorted(update_knobs(c.knobs).items())) for c in group[1:])


def run_groups(queue: GroupQueue, search: GroupSearch, jobs: int) -> None:
    """Searches the queue's groups with `search` (which returns the combinations of a group
    another worker is probing now, to come back to), in `jobs` threads."""
    if jobs == 1:
        _work(queue, search)
        return
    pool = ThreadPoolExecutor(jobs)
    try:
        for future in [pool.submit(_work, queue, search) for _ in range(jobs)]:
            future.result()
    except BaseException:
        # An interrupt or a failed probe: start no queued combination, and do not wait here
        # for the running ones; the caller stops the launcher, which ends their probes.
        queue.abort()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _work(queue: GroupQueue, search: GroupSearch) -> None:
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
