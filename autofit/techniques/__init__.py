"""Every technique, in the order its hooks run: precision first (it picks the dtypes the others
build in), the optimizer after everything that changes which parameters train."""

from autofit.techniques.attention import Attention
from autofit.techniques.base import ProbeContext, Technique
from autofit.techniques.checkpointing import Checkpointing
from autofit.techniques.ema import Ema
from autofit.techniques.encoders import Encoders
from autofit.techniques.optimizer import Optimizer
from autofit.techniques.precision import Precision
from autofit.techniques.swap_blocks import SwapBlocks
from autofit.techniques.train_mode import LoraRank, TrainMode
from autofit.techniques.validation import Validation
from autofit.techniques.zero import OffloadOptimizer, OffloadParams, WorldSize, ZeroStage

TECHNIQUES: tuple[Technique, ...] = (
    Precision(),
    TrainMode(),
    LoraRank(),
    Checkpointing(),
    Attention(),
    Encoders(),
    SwapBlocks(),
    Optimizer(),
    ZeroStage(),
    OffloadOptimizer(),
    OffloadParams(),
    WorldSize(),
    Ema(),
    Validation(),
)

__all__ = ["TECHNIQUES", "ProbeContext", "Technique"]
