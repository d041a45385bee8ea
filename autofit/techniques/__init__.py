"""Technique code every backend runs alike, on fake and real tensors: what a knob applies to a
run when no installed library does it as the trainers do (autofit/knobs/ says which knob uses which).

- `quantization`, `sdnq_eager`, `torchao_float8`: frozen bases stored in fewer bytes (4-bit,
  fp8, int8, quanto, SDNQ, torchao) and their linears;
- `optimizers/`: SimpleTuner's bf16 AdamW, the update in backward, one step split between GPU and host;
- `streaming`: weights brought onto the GPU around the modules that use them (block swap, ZeRO-3);
- `regional_compile`: torch.compile as a run's memory sees it;
- `selective_checkpoint`: torchtitan's per-op selective activation checkpointing;
- `fused_linear_ce`, `trl_head`: fused losses that keep no logits (Liger's, TRL's).
"""
