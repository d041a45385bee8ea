"""What precision's knob and its trainers' words both read."""

BF16_WEIGHTS = ("bf16_pure", "bf16_autocast")  # the values whose weights themselves are bf16
