"""compile=regional: each block compiled by torch's own Dynamo and AOTAutograd with inductor's
partitioner, its graphs run unfused with inductor's fusion kept in what is counted; run for real
on the CPU and on fake tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_refused, assert_same_allocations, refusal, spec, tiny_llama

from autofit.backends import cpu, simulate
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.techniques.regional_compile import _partition, fused_nodes

COMPILED = {"compile": "regional"}
PURE = {"precision": "bf16_pure", "optimizer": "adamw"}


@pytest.mark.long
@pytest.mark.parametrize(
    "knobs",
    [
        {**PURE, "checkpointing": False},
        {**PURE, "checkpointing": False, "loss": "chunked"},
        {"precision": "bf16", "optimizer": "adamw", "train_mode": "lora", "checkpointing": False},
    ],
    ids=["full", "chunked-loss", "lora-autocast"],
)
def test_a_compiled_llama_allocates_on_fake_tensors_what_it_allocates_on_real_ones(
    knobs: dict[str, Any],
) -> None:
    _, fake = simulate.trace(tiny_llama(**COMPILED, **knobs))
    _, real = cpu.trace(tiny_llama("cpu", **COMPILED, **knobs))
    assert_same_allocations(fake, real)


@pytest.mark.long
@pytest.mark.parametrize(
    ("precision", "checkpointing"),
    [("bf16", False), ("bf16_pure", False), ("bf16_pure", True), ("fp32", True)],
)
def test_a_compiled_sana_allocates_on_fake_tensors_what_it_allocates_on_real_ones(
    precision: str, checkpointing: bool
) -> None:
    probe = spec(
        "tiny_sana", batch_size=2, precision=precision, optimizer="adamw",
        checkpointing=checkpointing, **COMPILED,
    )  # fmt: skip
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert_same_allocations(fake, real)


@pytest.mark.long
def test_a_layer_that_checkpoints_itself_runs_compiled_inside_its_checkpoint() -> None:
    """transformers' layers checkpoint inside their own forward: compiled whole, Dynamo would
    stop at the checkpoint and run them eager. The forward they hand the checkpoint is compiled
    instead, as torchtune compiles each layer inside its checkpoint wrapper: one graph, reused by
    every layer, recomputed compiled in backward."""
    from torch._dynamo.utils import counters

    counters.clear()
    knobs = {**COMPILED, **PURE, "checkpointing": True, "loss": "chunked"}
    simulate.trace(tiny_llama(**knobs))
    layer_graphs = counters["stats"]["unique_graphs"] - 1  # the loss's chunk is the other one
    assert layer_graphs == 1
    assert counters["stats"]["calls_captured"] > 50  # the whole layer, not a fragment


def _activations(probe: Any) -> int:
    _, log = simulate.trace(probe)
    return log.peak_report().breakdown["activations"]


@pytest.mark.long
@pytest.mark.parametrize(
    "knobs",
    [{**PURE, "checkpointing": False}, {**PURE, "checkpointing": False, "loss": "chunked"}],
    ids=["blocks", "blocks-and-loss"],
)
def test_compiling_keeps_less_for_backward(knobs: dict[str, Any]) -> None:
    """The partitioner recomputes the blocks' cheap elementwise work (the norms, the SwiGLU
    product, the casts) in backward instead of saving it; with torchtune's chunked loss, each
    chunk's fp32 log-probabilities too."""
    assert _activations(tiny_llama(**COMPILED, **knobs)) < _activations(tiny_llama(**knobs))


@pytest.mark.long
def test_the_chunked_loss_is_compiled_with_the_blocks() -> None:
    """torchtune's compile_loss: with loss=chunked each chunk's upcast and cross-entropy is
    compiled too, which keeps the chunk's bf16 logits and its log-sum-exp for backward instead
    of its fp32 log-probabilities: compiling lowers the forward peak (reached in the loss) by
    more there than with transformers' own loss, of which only the blocks are compiled."""

    def forward_peak(**knobs: Any) -> int:
        _, log = simulate.trace(tiny_llama(**knobs, **PURE, checkpointing=False))
        return log.phase_peaks["forward"]

    blocks_only = forward_peak() - forward_peak(**COMPILED)
    with_loss = forward_peak(loss="chunked") - forward_peak(**COMPILED, loss="chunked")
    assert with_loss > blocks_only


def test_a_pointwise_chain_stays_inside_its_kernel_and_what_a_matmul_reads_is_written() -> None:
    """Inductor fuses a chain of pointwise ops and reductions into one kernel: its intermediates
    are never allocated, but what a matmul reads and what the graph returns are."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def block(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # an RMSNorm
        y = h.to(torch.bfloat16) @ w
        return torch.nn.functional.silu(y) * 2.0, y

    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 8, dtype=torch.bfloat16)
    graph = make_fx(block)(x, w).graph
    fused = fused_nodes(graph)
    aten = torch.ops.aten
    calls = [node for node in graph.nodes if node.op == "call_function"]
    mm = next(node for node in calls if node.target.overloadpacket is aten.mm)
    returned = set(next(node for node in graph.nodes if node.op == "output").all_input_nodes)
    assert mm not in fused  # a library kernel writes its output
    assert not set(mm.all_input_nodes) & fused  # and reads what is written
    assert not returned & fused
    norm = {aten.pow, aten.mean, aten.add, aten.rsqrt}
    assert all(node in fused for node in calls if node.target.overloadpacket in norm)
    silu = next(node for node in calls if node.target.overloadpacket is aten.silu)
    assert silu in fused  # computed inside the kernel that writes silu(y) * 2


def test_attention_is_saved_for_backward_not_recomputed() -> None:
    """Inductor's partitioner never recomputes a GPU attention kernel; the CPU's flash attention,
    which the step runs in its place, is held to the same rule."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    seen: dict[str, torch.fx.GraphModule] = {}

    def keep(name: str) -> Any:
        def compiler(graph: torch.fx.GraphModule, _: Any) -> Any:
            seen[name] = graph
            return make_boxed_func(graph)

        return compiler

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    aot_function(attention, keep("forward"), keep("backward"), partition_fn=_partition)(
        q, k, v
    ).sum().backward()
    backward_ops = {str(node.target) for node in seen["backward"].graph.nodes}
    assert not any("flash_attention_for_cpu.default" in op for op in backward_ops)
    assert any("flash_attention_for_cpu_backward" in op for op in backward_ops)


RULES = [
    ({**COMPILED}, "sdxl", "compile=regional compiles a model's repeated blocks; sdxl declares none"),
    ({**COMPILED, "train_mode": "qlora"}, "llama3_8b", "compile=regional with train_mode=qlora is not modelled"),
    ({**COMPILED, "train_mode": "lora", "base_precision": "fp8"}, "flux_dev", "compile=regional with base_precision=fp8 is not modelled"),
    ({**COMPILED, "fsdp": "full_shard", "world_size": 2}, "llama3_8b", "compile=regional with fsdp=full_shard is not modelled"),
    ({**COMPILED, "swap_blocks": 4}, "flux_dev", "compile=regional with swap_blocks=4 is not modelled"),
    ({**COMPILED, "checkpointing": True, "precision": "bf16"}, "sana_600m", "compile=regional with checkpointing under autocast (precision=bf16) is not modelled"),
    ({**COMPILED, "checkpointing": True, "precision": "bf16_pure", "offload_activations": "attention"}, "sd35_medium", "compile=regional with offload_activations=attention is not modelled"),
]  # fmt: skip


@pytest.mark.parametrize(("knobs", "model", "reason"), RULES)
def test_rules_name_the_value_and_what_is_valid(
    knobs: dict[str, Any], model: str, reason: str
) -> None:
    assert_refused(knobs, model, reason)


def test_what_is_modelled_is_valid() -> None:
    knobs = {**COMPILED, **PURE, "checkpointing": True, "loss": "chunked"}
    assert refusal(knobs, "llama3_8b") is None


def test_simpletuner_says_regional_compilation_and_trl_refuses() -> None:
    knob = REGISTRY["compile"]
    subject = Subject({**defaults(), **COMPILED}, load_preset("sd35_medium"))
    words = knob.express("simpletuner", "regional", subject)
    assert isinstance(words, Say)
    assert words.settings == {"dynamo_backend": "inductor", "dynamo_use_regional_compilation": True}
    llm = Subject({**defaults(), **COMPILED}, load_preset("llama3_8b"))
    assert isinstance(knob.express("trl", "regional", llm), Refuse)
    assert isinstance(knob.express("kohya", "regional", subject), Refuse)
