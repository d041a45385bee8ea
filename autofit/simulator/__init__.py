"""The simulator: what makes a training step on the CPU behave, and be priced, like one on a GPU.

- `tracker`: live tensor storage per category and phase, rounded as the CUDA allocator rounds;
- `allocator`: a model of the CUDA caching allocator, replayed over the tracker's events;
- `cuda_autocast`: CUDA's autocast cast policy, installed in place of the CPU's;
- `kernel_outputs`: the real kernels' output layouts where a meta function allocates differently;
- `fake_modules`: module moves that are no-ops under fake tensors;
- `roofline`: FLOPs and bytes per op against the GPU's table entry, for throughput.

The emulations of sharding and quantized layouts sit in autofit/emulations/, the fast path's
curves and assembled steps in autofit/fastpath/.

The `cpu` backend uses the same pieces on real tensors, which is how the tests hold the simulator
to the byte.
"""
