"""Optimizer implementations autofit needs beyond the libraries': SimpleTuner's bf16 AdamW with
stochastic rounding, and one step over parameters split between the GPU and the host. The
optimizer knob (autofit/knobs/optimizer.py) builds every optimizer it offers."""

LEARNING_RATE = 1e-4
