"""loss=chunked against loss=full on a small causal LM: the peak is lower by the logits, to the
byte; fake and real tensors allocate the same; the loss is the same number."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers import spec

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import invalid_reason, parse_all
from autofit.knobs.loss import CHUNKS
from autofit.models import ModelPreset, load_preset
from autofit.probe.spec import ProbeSpec

# Sizes chosen so that no two kinds of tensor share a size: batch x sequence x vocabulary
# dwarfs the rest, and the 192 tokens split into 8 equal chunks.
B, T, V, H = 2, 96, 8192, 40
TINY = {
    "vocab_size": V, "hidden_size": H, "intermediate_size": 72, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 10,
    "tie_word_embeddings": False,
}  # fmt: skip


def r(nbytes: int) -> int:
    """Rounded up to the CUDA allocator's 512-byte granularity."""
    return -(-nbytes // 512) * 512


def tiny_llm(**knobs: object) -> ProbeSpec:
    probe = spec("llama3_2_1b", batch_size=B, resolution=T, **knobs)
    arch = copy.deepcopy(probe.model["architecture"])
    arch["config"].update(TINY)
    return dataclasses.replace(probe, model={**probe.model, "architecture": arch})


def forward_peak(loss: str, precision: str) -> int:
    _, tracker = simulate.trace(tiny_llm(precision=precision, loss=loss))
    return tracker.phase_peaks["forward"]


def test_chunked_forward_peak_is_lower_by_the_logits() -> None:
    """Both forward peaks fall in the loss, when the log-probabilities are made. The full loss
    then holds the bf16 logits of every token, their fp32 copy and the fp32 log-probabilities;
    the chunked one holds every chunk's fp32 log-probabilities (saved for backward) and the last
    chunk's fp32 copy, never the bf16 logits of more than one chunk."""
    tokens = B * T
    bf16_logits = r(tokens * V * 2)
    fp32_logits = r(tokens * V * 4)
    fp32_chunk = r(tokens // CHUNKS * V * 4)
    # Bookkeeping, not logits: transformers keeps its labels padded by one position, int64
    # (the chunked loss frees that copy once it has the targets); the chunked loss keeps a 0-d
    # fp32 per chunk so far: each earlier chunk's weight total (saved by nll_loss), the running
    # sum, and the previous chunk's summand.
    padded_labels = r(B * (T + 1) * 8)
    scalars = (CHUNKS + 1) * r(4)
    difference = forward_peak("full", "bf16_pure") - forward_peak("chunked", "bf16_pure")
    assert difference == bf16_logits + fp32_logits - fp32_chunk + padded_labels - scalars


@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_fake_and_real_allocate_the_same(loss: str) -> None:
    probe = tiny_llm(precision="bf16_pure", loss=loss)
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes
    assert fake.peak_report() == real.peak_report()


@pytest.mark.parametrize("precision", ["bf16_pure", "bf16"])
def test_chunked_step_peak_is_lower(precision: str) -> None:
    """Over the whole step too, under autocast as well: the full loss also makes the fp32
    gradient of every logit at once in backward."""
    _, full = simulate.trace(tiny_llm(precision=precision, loss="full"))
    _, chunked = simulate.trace(tiny_llm(precision=precision, loss="chunked"))
    assert full.peak - chunked.peak >= r(B * T * V * 4)


def test_chunked_loss_is_the_models_own_loss() -> None:
    from autofit.workloads import workload_for
    from autofit.workloads.llm import loss_chunks

    preset = ModelPreset.from_dict(tiny_llm().model)
    workload = workload_for(preset)
    torch.manual_seed(0)
    model = workload.build_model(torch.float32)
    batch = workload.make_batch(B, T, torch.device("cpu"), torch.float32)
    full = workload.loss(model, batch)
    with loss_chunks(CHUNKS):
        chunked = workload.loss(model, batch)
    assert chunked.item() == pytest.approx(full.item(), rel=1e-5)


def test_chunked_is_for_causal_language_models_only() -> None:
    gpu = load_gpu("a40")
    llm, sana = load_preset("llama3_8b"), load_preset("sana_600m")
    assert invalid_reason(parse_all({"loss": "chunked"}), gpu, llm, "simulate") is None
    reason = invalid_reason(parse_all({"loss": "chunked"}), gpu, sana, "simulate")
    assert reason is not None and "\n" not in reason
    assert reason.startswith("loss=chunked") and "loss=full" in reason
