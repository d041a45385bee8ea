"""The categories of memory a step's tensors are counted in, in the order the logs index them."""

from __future__ import annotations

from enum import Enum


class Category(str, Enum):
    """What a tensor is to the step: its weights, their gradients, the optimizer's state, what
    forward saves for backward, or anything else (temporaries, until labelled otherwise)."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"


# The names in index order: a step log stores each allocation's category as an index into this.
CATEGORIES = tuple(category.value for category in Category)
