"""CUDA's autocast cast policy, installed on the CPU's autocast.

CPU autocast casts a different list of ops than CUDA autocast does: CUDA runs layer_norm,
group_norm, softmax, exp, pow, sum and friends in fp32 where CPU leaves them in bf16, and CPU
runs some ops (padding, 3-D pooling, cat's promotion) under policies CUDA does not have. The dtype
an op runs in decides the bytes of its output and of what autograd saves, so the `simulate` and
`cpu` backends replace the AutocastCPU kernels of every op on which the two differ with CUDA's
policy. The lists are CUDA's, from aten/src/ATen/autocast_mode.{h,cpp} (PyTorch 2.x).

One difference is left on purpose: CUDA autocast caches the low-precision copy of a weight used
twice in one forward; the Python kernels below do not. It touches only the ops registered here
that CPU autocast does not already cast (einsum, addmv, ...), which do not take weights in the
models autofit ships; linear, matmul, mm, bmm and convolutions keep the C++ kernels and their cache.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

# CUDA casts these to the low-precision dtype; CPU autocast leaves them alone.
LOWER_PRECISION = (
    "_convolution",
    "convolution",
    "addmv",
    "addr",
    "einsum",
    "mv",
    "chain_matmul",
    "linalg_multi_dot",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
)
# CUDA runs these in fp32 (CastPolicy::fp32).
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
)  # fmt: skip
# CUDA runs these in fp32 by setting their output dtype, unless the caller set one.
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)  # fmt: skip
# CUDA runs these in the widest floating dtype among their inputs.
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
)  # fmt: skip
# CPU autocast has a policy for these and CUDA has none: run them as they come.
NO_POLICY = (
    "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "max_unpool2d", "max_unpool3d",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "grid_sampler_2d", "grid_sampler_3d", "polar", "view_as_complex",
    "stft", "stft.center", "cat", "stack", "index_copy", "_native_multi_head_attention",
    "_addmm_activation",
)  # fmt: skip
# norm without an output dtype: CUDA appends fp32 (CastPolicy::fp32_append_dtype).
NORM_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_library: torch.library.Library | None = None


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
        and value.device.type == "cpu"
    )


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(values: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors(value))
    return found


def _op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _kernel(op: Any, policy: str) -> Callable[..., Any]:
    dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if policy == "lower":
                low = torch.get_autocast_dtype("cpu")
                return op(*_cast(args, low), **{k: _cast(v, low) for k, v in kwargs.items()})
            if policy == "fp32":
                f32 = torch.float32
                return op(*_cast(args, f32), **{k: _cast(v, f32) for k, v in kwargs.items()})
            if policy == "set_opt_dtype":
                if args and _eligible(args[0]):
                    if dtype_index is not None and dtype_index < len(args):
                        if args[dtype_index] is None:
                            args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1 :])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if policy == "promote":
                floats = [t for t in _tensors((*args, *kwargs.values())) if _eligible(t)]
                wide = (
                    torch.float32
                    if any(t.dtype == torch.float32 for t in floats)
                    else torch.get_autocast_dtype("cpu")
                )
                return op(*_cast(args, wide), **{k: _cast(v, wide) for k, v in kwargs.items()})
            return op(*args, **kwargs)  # no policy

    return run


def _norm_kernel(target: Any) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if args and _eligible(args[0]):
                return target(*args, dtype=torch.float32, **kwargs)
            return target(*args, **kwargs)

    return run


def install() -> None:
    """Give the CPU's autocast CUDA's cast policy, for the rest of this process."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    tables = (
        (LOWER_PRECISION, "lower"),
        (FP32, "fp32"),
        (FP32_SET_OPT_DTYPE, "set_opt_dtype"),
        (PROMOTE, "promote"),
        (NO_POLICY, "none"),
    )

    with warnings.catch_warnings():
        # Replacing a C++ autocast kernel is the point; torch warns about each one.
        warnings.simplefilter("ignore")
        for names, policy in tables:
            for name in names:
                try:
                    op = _op(name)
                except AttributeError:  # an op this torch build does not have
                    log.debug("autocast policy: no op %s in this torch", name)
                    continue
                library.impl(name, _kernel(op, policy), "AutocastCPU")
        for name, target in NORM_APPEND_DTYPE.items():
            library.impl(name, _norm_kernel(_op(target)), "AutocastCPU")
    _library = library
