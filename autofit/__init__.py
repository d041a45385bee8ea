"""autofit: find the largest and fastest training run that fits in a GPU's memory."""

import logging

__version__ = "0.1.0"

# On a CPU with AVX512-BF16, importing bitsandbytes (peft imports it) logs that the hub's faster
# CPU 4-bit matmul kernel is not installed. Only speed is at stake (its own fallback runs), and
# the line would stand between a user and autofit's one-line output, on some machines only.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

# Importing torchao (peft and transformers import it where it is installed) logs a warning per
# CUDA extension it cannot load on this machine, torch warns about the enums torchao registers
# with pytree, and diffusers' torchao quantizer that it cannot load serialized torchao tensors:
# none touch what autofit runs of torchao (base_precision=fp8wo_torchao, fp8_torchao).
for _name in ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer"):
    logging.getLogger(_name).setLevel(logging.ERROR)
