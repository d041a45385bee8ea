"""SDNQ, imported to run eagerly: `SDNQ_USE_TORCH_COMPILE=0` (unless the user set it) before
sdnq reads it at its own import. autofit's probes run SDNQ's code without torch.compile on every
backend (autofit/techniques/quantization.py, `sdnq_base`, says what that leaves out). A knob names this
module among its libraries so that a run imports it before it is built, outside fake mode, and
autofit imports SDNQ's entry point from here only."""

import os

os.environ.setdefault("SDNQ_USE_TORCH_COMPILE", "0")  # read by sdnq.common at import: first

from sdnq.training import sdnq_training_post_load_quant  # noqa: E402,F401  (after the variable)
