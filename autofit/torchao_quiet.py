"""torchao, imported without its import-time notices in a probe's output: on a machine without
its CUDA extensions it logs a warning per extension it cannot load, torch warns about the enums
it registers with pytree, and diffusers' torchao quantizer (loaded by PEFT's dispatch) that it
cannot import serialized torchao tensors; none of them touch what autofit runs (torchao's
Float8WeightOnly layout and its dequantizing linear). A knob names this module among its
libraries so that a run imports it before it is built, outside fake mode."""

import logging

_NOISY = ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer")
_levels = {name: logging.getLogger(name).level for name in _NOISY}
for _name in _NOISY:
    logging.getLogger(_name).setLevel(logging.ERROR)
try:
    import torchao.quantization  # noqa: F401  (loads its extensions and registrations)
finally:
    for _name in _NOISY[:2]:  # the quantizer's notice comes later, when PEFT loads it
        logging.getLogger(_name).setLevel(_levels[_name])
