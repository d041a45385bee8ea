"""The frozen models that run beside a trained one, built by kind with random weights.

A preset lists them under `companions` (`kind`, `dtype`, `architecture`); the kinds are a plain
dict, so a config never names code. Each builder takes the architecture as the library's own
config would spell it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Imported here, not inside the builders: a library imported for the first time under fake
# tensors would make its module-level constant tensors fake.
from diffusers import AutoencoderDC
from transformers import Gemma2Config, Gemma2Model

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _gemma2(architecture: dict[str, Any]) -> torch.nn.Module:
    return Gemma2Model(Gemma2Config(**architecture))


def _dc_ae(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderDC(**architecture)


KINDS: dict[str, Callable[[dict[str, Any]], torch.nn.Module]] = {
    "gemma2": _gemma2,
    "dc_ae": _dc_ae,
}


def companion_dtype(spec: dict[str, Any]) -> torch.dtype:
    return DTYPES[spec.get("dtype", "bf16")]


def build_companion(spec: dict[str, Any]) -> torch.nn.Module:
    """Build one companion under the caller's device, in its own dtype."""
    from autofit.training import default_dtype

    with default_dtype(companion_dtype(spec)):
        return KINDS[spec["kind"]](spec["architecture"])
