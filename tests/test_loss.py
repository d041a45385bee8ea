"""loss=chunked, fused_linear, full_native and chunked_native against loss=full on a small causal
LM: the chunked peak is lower by the logits, to the byte; the fused loss holds Liger-Kernel's
buffers and a few rows besides; the native losses hold 16-bit logits where full holds fp32 ones;
fake and real tensors allocate the same; the loss (and the fused loss's gradients) are the same
numbers."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import spec

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, invalid_reason, parse_all
from autofit.knobs.loss import CHUNKS
from autofit.models import ModelPreset, load_preset
from autofit.records.probe import ProbeSpec

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
    the chunked one (torchtune's, whose model returns every chunk's logits before the loss
    runs) holds the bf16 logits of every chunk too, every chunk's fp32 log-probabilities (saved
    for backward) and the last chunk's fp32 copy: it saves the fp32 copy of all but one chunk."""
    tokens = B * T
    fp32_logits = r(tokens * V * 4)
    fp32_chunk = r(tokens // CHUNKS * V * 4)
    # Bookkeeping, not logits: transformers keeps its labels padded by one position, int64
    # (the chunked loss frees that copy once it has the targets); the chunked loss keeps a 0-d
    # fp32 per chunk so far: each earlier chunk's weight total (saved by nll_loss), the running
    # sum, and the previous chunk's summand.
    padded_labels = r(B * (T + 1) * 8)
    scalars = (CHUNKS + 1) * r(4)
    difference = forward_peak("full", "bf16_pure") - forward_peak("chunked", "bf16_pure")
    assert difference == fp32_logits - fp32_chunk + padded_labels - scalars


@pytest.mark.long
@pytest.mark.parametrize(
    "loss,precision",
    [
        ("full", "bf16_pure"),
        ("chunked", "bf16_pure"),
        ("fused_linear", "bf16_pure"),
        ("fused_linear", "fp32"),
        ("fused_linear", "bf16_autocast"),
        ("full_native", "bf16_pure"),
        ("full_native", "bf16"),
        ("chunked_native", "bf16_pure"),
        ("chunked_native", "bf16"),
        ("trl_fused", "bf16_pure"),
        ("trl_fused", "bf16"),
    ],
)
def test_fake_and_real_allocate_the_same(loss: str, precision: str) -> None:
    """(Not fused_linear under precision=bf16: its fp32 weight gradient is summed through
    `addmm(out_dtype=fp32)`, which the CPU lacks; autofit/techniques/fused_linear_ce.py.)"""
    probe = tiny_llm(precision=precision, loss=loss)
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


def _tiny_fp32_run() -> tuple[Any, torch.nn.Module, Any]:
    """The tiny language model's workload, an fp32 model of it (seeded) and a batch, on the CPU."""
    from autofit.workloads import workload_for

    workload = workload_for(ModelPreset.from_dict(tiny_llm().model))
    torch.manual_seed(0)
    model = workload.build_model(torch.float32)
    return workload, model, workload.make_batch(B, T, torch.device("cpu"), torch.float32)


def test_chunked_loss_is_the_models_own_loss() -> None:
    workload, model, batch = _tiny_fp32_run()
    full = workload.loss(model, batch)
    eager = SimpleNamespace(knobs={"compile": "off"})  # the one field the loss reads
    with REGISTRY["loss"].forward_context(eager, "chunked"):  # type: ignore[arg-type, union-attr]
        chunked = workload.loss(model, batch)
    assert chunked.item() == pytest.approx(full.item(), rel=1e-5)


@pytest.mark.parametrize("loss", ["full_native", "chunked_native", "trl_fused"])
def test_native_losses_are_the_models_own_loss(loss: str) -> None:
    """In fp32 the logits' own dtype is fp32: the same number as the model's loss."""
    workload, model, batch = _tiny_fp32_run()
    full = workload.loss(model, batch)
    context = REGISTRY["loss"].forward_context(None, loss)  # type: ignore[arg-type]
    assert context is not None
    with context:
        native = workload.loss(model, batch)
    assert native.item() == pytest.approx(full.item(), rel=1e-5)


def test_full_native_forward_holds_16_bit_logits() -> None:
    """Under pure bf16 the full loss's forward peak holds the bf16 logits, their fp32 copy and
    the fp32 log-probabilities; the native one the bf16 logits, their shifted bf16 copy and the
    bf16 log-probabilities of all positions but the last. Besides: transformers' padded int64
    labels (full) against the shifted int64 targets (native), and 0-d scalars."""
    logits = r(B * T * V * 2)
    fp32 = r(B * T * V * 4)
    shifted = r(B * (T - 1) * V * 2)
    difference = forward_peak("full", "bf16_pure") - forward_peak("full_native", "bf16_pure")
    bookkeeping = r(B * (T + 1) * 8)  # the larger of the label copies
    assert abs(difference - (logits + 2 * fp32 - logits - 2 * shifted)) <= bookkeeping


def test_chunked_native_keeps_the_logits_through_backward() -> None:
    """LitGPT's loop holds the list of logit slices until the next step's forward: the bf16
    logits are still there when backward makes its gradients, so its backward peak is above
    its forward peak by at least them, where the native full loss frees them with the loss."""
    _, chunked = simulate.trace(tiny_llm(precision="bf16_pure", loss="chunked_native"))
    _, full = simulate.trace(tiny_llm(precision="bf16_pure", loss="full_native"))
    logits = r(B * T * V * 2)
    assert chunked.phase_peaks["optimizer"] - full.phase_peaks["optimizer"] >= logits


@pytest.mark.parametrize(
    "loss", ["chunked", "fused_linear", "full_native", "chunked_native", "trl_fused"]
)
def test_chunked_and_fused_are_for_causal_language_models_only(loss: str) -> None:
    gpu = load_gpu("a40")
    llm, sana = load_preset("llama3_8b"), load_preset("sana_600m")
    assert invalid_reason(parse_all({"loss": loss}), gpu, llm, "simulate") is None
    reason = invalid_reason(parse_all({"loss": loss}), gpu, sana, "simulate")
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"loss={loss}") and "loss=full" in reason


# --- loss=fused_linear: Liger-Kernel's fused linear cross-entropy -------------------------------


def test_liger_chunk_rule() -> None:
    """Liger's own example (its comment in fused_linear_cross_entropy.py): 4 x 4096 tokens of a
    32,000-token vocabulary at hidden size 4096 go in chunks of 2048; Llama 3 8B's 8192 tokens in
    chunks of 256; never more rows than there are."""
    from autofit.techniques.fused_linear_ce import chunk_rows

    assert chunk_rows(4 * 4096, 32000, 4096) == 2048
    assert chunk_rows(8192, 128256, 4096) == 256
    assert chunk_rows(100, 1000, 4096) == 100


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_holds_ligers_buffers(dtype: torch.dtype) -> None:
    """Forward holds the hidden states' and the weight's gradients (in their dtype), the per-row
    losses (fp32), the mask of rows with a target, their count and one chunk's logits buffer in
    the model's dtype, and a few rows of temporaries besides: never the logits of every token
    nor an fp32 chunk. With fp32 gradients of fp32 logits Liger adds a vocabulary x hidden
    product per chunk. After forward the two gradients remain; backward scales them in place
    (the incoming gradient's one 0-d tensor) and hands them to the parameters."""
    from autofit.simulator.tracker import MemoryTracker
    from autofit.techniques.fused_linear_ce import FusedLinearCrossEntropy, chunk_rows

    rows, hidden, vocabulary, size = 192, 64, 2048, 8
    assert chunk_rows(rows, vocabulary, hidden) == size  # 24 chunks
    e = dtype.itemsize
    tracker = MemoryTracker(device_type="cpu")
    with tracker:
        inputs = torch.randn(rows, hidden, dtype=dtype, requires_grad=True)
        weight = torch.nn.Parameter(torch.randn(vocabulary, hidden, dtype=dtype))
        targets = torch.randint(0, vocabulary, (rows,))
        base, tracker.peak = tracker.current, 0
        loss = FusedLinearCrossEntropy.apply(inputs, weight, targets)
        forward, after = tracker.peak - base, tracker.current - base
        tracker.peak = 0
        loss.backward()
        backward = tracker.peak - base
    gradients = r(rows * hidden * e) + r(vocabulary * hidden * e)
    held = gradients + r(rows * 4) + r(rows) + r(8) + r(size * vocabulary * e)
    product = r(vocabulary * hidden * 4) if dtype == torch.float32 else 0
    assert held + product <= forward <= held + product + 16 * 512
    assert after == gradients + r(4)  # and the loss
    assert backward == after + r(4)
    assert inputs.grad is not None and weight.grad is not None


def test_fused_loss_and_gradients_are_torchs_cross_entropy() -> None:
    """On rows that do not fill the last chunk, with rows that have no target."""
    from autofit.techniques.fused_linear_ce import IGNORE_INDEX, FusedLinearCrossEntropy

    torch.manual_seed(0)
    inputs = torch.randn(37, 8, requires_grad=True)
    weight = torch.randn(100, 8, requires_grad=True)
    targets = torch.randint(0, 100, (37,))
    targets[[5, 36]] = IGNORE_INDEX
    fused = FusedLinearCrossEntropy.apply(inputs, weight, targets)
    (3 * fused).backward()  # an incoming gradient other than 1
    fused_grads = inputs.grad, weight.grad
    inputs.grad = weight.grad = None
    plain = torch.nn.functional.cross_entropy(inputs @ weight.t(), targets)
    (3 * plain).backward()
    assert fused.item() == pytest.approx(plain.item(), rel=1e-6)
    torch.testing.assert_close(fused_grads[0], inputs.grad)
    torch.testing.assert_close(fused_grads[1], weight.grad)


def test_fused_loss_and_gradients_are_the_models_own() -> None:
    workload, model, batch = _tiny_fp32_run()
    full = workload.loss(model, batch)
    full.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with REGISTRY["loss"].forward_context(None, "fused_linear"):  # type: ignore[arg-type, union-attr]
        fused = workload.loss(model, batch)
    fused.backward()
    assert fused.item() == pytest.approx(full.item(), rel=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("precision", ["bf16_pure", "bf16"])
def test_fused_peaks_are_lower_than_chunked(precision: str) -> None:
    """In forward it keeps no chunk's fp32 log-probabilities (the chunked loss keeps all of
    them) but the weight's gradient (fp32 under autocast); over the step it is lower too."""
    _, chunked = simulate.trace(tiny_llm(precision=precision, loss="chunked"))
    _, fused = simulate.trace(tiny_llm(precision=precision, loss="fused_linear"))
    log_probabilities = r(B * T * V * 4) - r(B * T // CHUNKS * V * 4)
    weight_gradient = r(V * H * (2 if precision == "bf16_pure" else 4))
    difference = chunked.phase_peaks["forward"] - fused.phase_peaks["forward"]
    assert difference >= log_probabilities - weight_gradient
    assert fused.peak < chunked.peak


def test_fused_saves_memory_over_chunked_where_searched() -> None:
    loss = REGISTRY["loss"]
    assert loss.saves_memory_over("fused_linear", ("full", "chunked", "fused_linear")) == "chunked"
    assert loss.saves_memory_over("fused_linear", ("full", "fused_linear")) == "full"


# --- loss=trl_fused: TRL 1.16 SFTTrainer's fused LM head, run by TRL's own code ----------------


@pytest.mark.parametrize("train_mode", ["full", "lora"])
def test_trl_fused_fake_and_real_allocate_the_same(train_mode: str) -> None:
    """TRL's own head on fake and on real CPU tensors, the head trained (its fp32 gradient sum)
    or frozen; the fold's tile temporaries counted on neither (a GPU's Triton kernel has none)."""
    probe = tiny_llm(precision="bf16_pure", loss="trl_fused", train_mode=train_mode)
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes
    assert fake.peak_report() == real.peak_report()


def test_trl_fused_holds_one_tile_never_the_logits() -> None:
    """The full loss's forward holds the bf16 logits of every token, their fp32 copy and the fp32
    log-probabilities; TRL's head one reused bf16 tile, (at most) 4096 scored tokens by its
    32768-entry vocabulary chunk however small the vocabulary (here 190 tokens, 8192 entries),
    and per-token vectors."""
    tile = r(min(B * (T - 1), 4096) * 32768 * 2)
    logits = r(B * T * V * 2) + 2 * r(B * T * V * 4)
    difference = forward_peak("full", "bf16_pure") - forward_peak("trl_fused", "bf16_pure")
    per_token = 16 * r(B * T * 8)  # labels, masks, running statistics and their like
    assert abs(difference - (logits - tile)) <= per_token


def test_uncounted_storages_are_counted_nowhere() -> None:
    from autofit.simulator.tracker import MemoryTracker, uncounted

    with MemoryTracker() as tracker:
        kept = torch.empty(1000)
        with uncounted():
            scratch = torch.empty(5000)
            kept.add_(1)  # in place: no new storage
            del scratch
        after = torch.empty(3000)
    assert [tracker.sizes[i] for i in range(len(tracker.sizes))] == [r(4000), r(12000)]
    assert tracker.host_sizes == []
    del kept, after
