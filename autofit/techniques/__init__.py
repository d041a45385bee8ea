"""Every technique, in the order its hooks run (precision first: it picks the dtypes the others
build in)."""

from autofit.techniques.base import Technique
from autofit.techniques.checkpointing import Checkpointing
from autofit.techniques.optimizer import Optimizer
from autofit.techniques.precision import Precision

TECHNIQUES: tuple[Technique, ...] = (Precision(), Checkpointing(), Optimizer())

__all__ = ["TECHNIQUES", "Technique"]
