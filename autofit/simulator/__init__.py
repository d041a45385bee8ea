"""The simulator: what makes a training step on the CPU behave, and be priced, like one on a GPU.

- `tracker`: live tensor storage per category and phase, rounded as the CUDA allocator rounds;
- `allocator`: a model of the CUDA caching allocator, replayed over the tracker's events;
- `cuda_autocast`: CUDA's autocast cast policy, installed in place of the CPU's;
- `kernel_outputs`: the real kernels' output layouts where a meta function allocates differently;
- `fake_modules`: module moves that are no-ops under fake tensors;
- `roofline`: FLOPs and bytes per op against the GPU's table entry, for throughput;
- `zero`: one rank of DeepSpeed ZeRO, laid out for fake tensors and for any GPU count;
- `nf4_layout`, `bnb_layout`: bitsandbytes' 4-bit weights and 8-bit optimizer states, for fake
  tensors (their real step reads values a fake tensor does not have);
- `streaming`: weights brought onto the GPU around the modules that use them (block swap, ZeRO-3);
- `first_step`: two steps' log from one forward and backward pass, and one pass for the
  structures that differ only in their update (the optimizers of a scan group).

The `cpu` backend uses the same pieces on real tensors, which is how the tests hold the simulator
to the byte.
"""
