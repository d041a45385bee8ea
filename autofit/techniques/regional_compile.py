"""torch.compile as a training run's memory sees it: what backward keeps is what AOTAutograd's
partitioner saves, and the kernels that run are the graph's own ops.

A compiled region's forward and backward are one joint graph, split by a partitioner into the
forward (which returns what backward needs) and the backward. Inductor, torch.compile's default
backend, splits it with `min_cut_rematerialization_partition(compiler="inductor")` over its own
decompositions (torch/_inductor/compile_fx.py): cheap elementwise work (a norm's normalised
output, an activation, a cast) is recomputed in backward from a smaller tensor instead of being
saved. That choice is what compiling changes in what a step holds between forward and backward,
and it is made here by torch's own Dynamo, AOTAutograd and partitioner, on whatever tensors the
run has (fake ones in a simulation, real ones on the CPU).

Inductor's code generation is not run (it needs a compiler and a device); its fusion is kept
in what is counted. Inductor fuses chains of pointwise ops, reductions and views into one kernel
whose intermediates never reach memory: only what a kernel writes for something outside the chain
(a matmul, attention or convolution, which run as library kernels, or the graph's outputs: the
block's result and what it saves for backward) is allocated. The partitioned graphs run op by op
here, and an intermediate that inductor would keep inside a fused kernel is made uncounted
(`fused_nodes`), so the transient memory inside a region is the fused run's as well, to the
precision of that rule: inductor's own heuristics sometimes write a shared intermediate out, and
its memory planner reuses a dead buffer for a new one of the same size, neither of which is
modelled.

The memory tracker and the roofline counter are dispatch modes that declare
`ignore_compile_internals`: Dynamo turns them off while it traces and compiles, and back on
while the compiled graph runs, so they count the compiled run's ops and nothing of the
compiler's work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from autofit.simulator.tracker import uncounted

# Each block of a model is compiled once per variant (SD3.5 Medium's blocks differ in their
# second attention and last block): far fewer than this, which only stops a run silently going
# eager after many recompilations.
RECOMPILE_LIMIT = 64


aten = torch.ops.aten
prims = torch.ops.prims
# Ops inductor lowers into fused loops besides those tagged pointwise, reduction or view:
# casts, copies, constants, ranges, gathers, concatenation, and the untagged prims sum.
FUSED_PACKETS = frozenset(
    (
        aten._to_copy, aten.copy, aten.full, aten.full_like, aten.scalar_tensor, aten.zeros,
        aten.zeros_like, aten.ones, aten.ones_like, aten.arange, aten.index,
        aten.embedding, aten.gather, aten.cat, aten.constant_pad_nd, aten.slice_scatter,
        aten.select_scatter, aten.fill, prims.iota, prims.sum,
    )
)  # fmt: skip


def _fusible(node: torch.fx.Node) -> bool:
    """Whether inductor would compute `node` inside a fused kernel (its code generation lowers
    pointwise ops, reductions, views and the ops above to loops it fuses)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target.is_view or target.overloadpacket in FUSED_PACKETS:
        return True
    return torch.Tag.pointwise in target.tags or torch.Tag.reduction in target.tags


def fused_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes whose output stays inside a fused kernel: fusible, and read only by fusible
    nodes (which compute it inline), a view of it only if the view stays inside too (a view is
    its base's memory). Anything read by a library kernel (a matmul, attention, a convolution,
    a random op) or returned by the graph is written to memory."""
    written: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):  # users before the nodes they read
        if not _fusible(node) or any(
            not _fusible(user) or (user.target.is_view and user in written)  # type: ignore[union-attr]
            for user in node.users
        ):
            written.add(node)
    return {node for node in graph.nodes if node.op == "call_function" and node not in written}


def _run_fused(graph: torch.fx.GraphModule, example_inputs: Any) -> Callable[[list[Any]], Any]:
    """AOTAutograd's compiler for the forward and the backward graph: the partitioned graph run
    op by op, fused as inductor fuses, its inputs and each value released after their last
    use (as inductor's code releases them), the values that stay inside a fused kernel made
    uncounted. Boxed: the caller's list of inputs is emptied, so an input (a tensor saved for
    backward) dies at its last use, not when the graph returns."""
    from torch.fx.node import map_arg

    nodes = list(graph.graph.nodes)
    fused = fused_nodes(graph.graph)
    last_use: dict[torch.fx.Node, list[torch.fx.Node]] = {node: [] for node in nodes}
    seen: set[torch.fx.Node] = set()
    for node in reversed(nodes):
        for read in node.all_input_nodes:
            if read not in seen:
                seen.add(read)
                last_use[node].append(read)

    def run(args: list[Any]) -> Any:
        inputs = list(reversed(args))
        args.clear()
        env: dict[torch.fx.Node, Any] = {}
        for node in nodes:
            if node.op == "placeholder":
                env[node] = inputs.pop()
            elif node.op == "get_attr":
                env[node] = getattr(graph, str(node.target))
            elif node.op == "output":
                return map_arg(node.args[0], env.__getitem__)
            else:
                call_args = map_arg(node.args, env.__getitem__)
                call_kwargs = map_arg(node.kwargs, env.__getitem__)
                if node in fused:
                    with uncounted():
                        env[node] = node.target(*call_args, **call_kwargs)
                else:
                    env[node] = node.target(*call_args, **call_kwargs)
            for dead in last_use[node]:
                del env[dead]
        raise AssertionError("a graph without an output")

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _partition(joint: torch.fx.GraphModule, inputs: Any, **options: Any) -> Any:
    """Inductor's partitioner, which never recomputes a compute-intensive kernel in backward
    (matmuls, convolutions, CUDA's flash and memory-efficient attention): the step on the CPU
    runs CPU flash attention where a GPU runs CUDA's, and it is held to the same rule (without
    it the partitioner would recompute attention, which a GPU run saves)."""
    from torch._functorch import partitioners

    plain = partitioners.get_default_op_list

    def with_cpu_attention() -> Any:
        ops = plain()
        ops.compute_intensive_ops.add(aten._scaled_dot_product_flash_attention_for_cpu)
        return ops

    partitioners.get_default_op_list = with_cpu_attention
    try:
        return partitioners.min_cut_rematerialization_partition(
            joint, inputs, compiler="inductor", **options
        )
    finally:
        partitioners.get_default_op_list = plain


@functools.cache
def backend() -> Callable[..., Any]:
    """torch.compile's backend: AOTAutograd with inductor's decompositions and partitioner, the
    partitioned graphs run unfused."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    return aot_autograd(
        fw_compiler=_run_fused,
        bw_compiler=_run_fused,
        partition_fn=_partition,
        decompositions=select_decomp_table(),
        keep_inference_input_mutations=True,
    )


def fresh_compiler() -> None:
    """Forget every earlier compilation in this process: a run's blocks compile for it alone,
    and an earlier run's graphs (another model in the same test process) count against no
    recompilation limit of its own."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT


def compile_module(module: torch.nn.Module) -> None:
    """Compile `module` in place, as `module.compile()` does (its forward, hooks and all)."""
    module.compile(backend=backend(), dynamic=False)


def compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` compiled as `torch.compile(function)` does."""
    return torch.compile(function, backend=backend(), dynamic=False)


def checkpoints_itself(block: torch.nn.Module) -> bool:
    """Whether `block` runs gradient checkpointing inside its own forward, as transformers'
    layers do (GradientCheckpointingLayer): compiled whole, Dynamo would stop at torch's
    checkpoint and run the layer uncompiled, so such a layer is compiled inside it instead."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return isinstance(block, GradientCheckpointingLayer)


def compiled_inside_checkpoint(function: Callable[..., Any]) -> Callable[..., Any]:
    """What a checkpoint runs, compiled where it is the forward of a layer that checkpoints
    itself (`checkpoints_itself`, which hands the checkpoint `partial(forward, layer, ...)`);
    anything else as it is (diffusers' models hand the checkpoint the block, compiled already).

    torchtune wraps each layer in its activation-checkpoint wrapper and compiles the layer inside
    it, so backward recomputes the compiled layer: the same here (Dynamo reuses one graph for
    every layer of the same shape)."""
    if isinstance(function, functools.partial) and function.args:
        layer = function.args[0]
        if isinstance(layer, torch.nn.Module) and checkpoints_itself(layer):
            return compiled(function)
    return function
