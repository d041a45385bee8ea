"""Emulations: the stacks that change what one GPU holds, laid out where the real library cannot
run on fake tensors or on one CPU process (each module opens with what it leaves out).

- `zero`, `zero_gather`: one rank of DeepSpeed ZeRO 1-3 for any GPU count, and ZeRO-3's gathers;
- `fsdp`, `fsdp_groups`, `fsdp_real`: FSDP2 (`fully_shard`), the groups accelerate makes, and
  `fully_shard` itself on fake tensors;
- `fsdp1`, `fsdp1_units`, `fsdp1_real`: FSDP1's flat parameters, its units, and the library's own
  code on fake tensors;
- `nvme`: ZeRO-Infinity's NVMe offload as host memory sees it;
- `nf4_layout`, `bnb_layout`: bitsandbytes' 4-bit weights and 8-bit optimizer states.
"""
