"""What the search made of one combination: its `Status`, as a study records it."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """What the search made of one combination at one resolution. A closed set."""

    PENDING = "pending"  # not searched yet
    EXACT = "exact"  # its largest fitting batch was found (`best_batch`)
    NONE_FIT = "none_fit"  # not even the space's smallest batch fits
    PRUNED = "pruned"  # a faster combination already fits all it could fit
    INVALID = "invalid"  # it cannot run (on this GPU, for this model, in the asked trainer)
    FAILED = "failed"  # a probe crashed or timed out, so its largest batch is not known
