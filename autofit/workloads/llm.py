"""Causal language models (transformers): next-token cross-entropy on sequences of random token
ids. For this family the `resolution` knob is the sequence length in tokens, and throughput is
reported in tokens per second as well."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from autofit.workloads.base import Batch, CheckpointFn, Workload
from autofit.workloads.diffusion import token_ids

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}


class CausalLMWorkload(Workload):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        config_class, model_class = ARCHITECTURES[self.preset.architecture["kind"]]
        config = config_class(**self.preset.architecture["config"])
        config._attn_implementation = "sdpa"  # fused attention, as training scripts ask for
        return model_class(config)

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        vocab = self.preset.architecture["config"]["vocab_size"]
        return {"input_ids": token_ids(batch_size, resolution, vocab, device)}

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        # The labels are the inputs: the model shifts them and upcasts the logits for the loss,
        # as a fine-tuning run does.
        return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpoint)  # type: ignore[operator]


WORKLOAD = CausalLMWorkload
