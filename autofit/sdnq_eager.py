"""SDNQ, imported to run eagerly: `SDNQ_USE_TORCH_COMPILE=0` (unless the user set it) before
sdnq reads it at its own import. autofit's probes run SDNQ's code without torch.compile on every
backend (autofit/quantization.py, `sdnq_base`, says what that leaves out). A knob names this
module among its libraries so that a run imports it before it is built, outside fake mode."""

import os

os.environ.setdefault("SDNQ_USE_TORCH_COMPILE", "0")  # read by sdnq.common at import: first

import sdnq.training  # noqa: E402,F401  (imported for its effect: the module, loaded eagerly)
