"""Which combinations of a wave the search takes up together, and in what order.

A simulated search scans the combinations that share what a sample adds (`hint_key`: the
resolution and the knobs whose `per_sample_memory` is true) as one group: one subprocess, the
first one's batch curve lent to the others where their steps agree (autofit/fastpath/scan.py).
A search that probes batch by batch (a real backend) takes them one at a time, spread so that
the first of each set sharing an estimate finishes, and shares it, before the others start.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from autofit.search.combination import Combination, hint_key


def search_groups(wave: list[Combination], scans: bool) -> list[list[Combination]]:
    """A wave's combinations in the groups searched together, in the order to search them;
    `scans`: whether the search answers a structure for every batch at once."""
    if scans:
        groups: dict[tuple[Any, ...], list[Combination]] = defaultdict(list)
        for combination in wave:
            groups[hint_key(combination.knobs, combination.resolution)].append(combination)
        return list(groups.values())
    seen: dict[tuple[Any, ...], int] = defaultdict(int)
    order = []
    for combination in wave:
        key = hint_key(combination.knobs, combination.resolution)
        order.append((seen[key], len(order), combination))
        seen[key] += 1
    return [[c] for _, _, c in sorted(order, key=lambda item: item[:2])]
