"""The short human summary `autofit probe` prints (the JSON result holds everything)."""

from __future__ import annotations

from autofit.host import NOT_STATED
from autofit.records.probe import Outcome, ProbeResult
from autofit.units import count, flops, seconds, size, value

LOG_LINES = 8


def headroom(peak_bytes: int, budget_bytes: int) -> str:
    """What a run leaves free of its budget, as the best line, report and export show it. "of
    budget" is the peak's share, as in every table's column of that name."""
    free = budget_bytes - peak_bytes
    return f"{size(free)} headroom, the peak {peak_bytes / budget_bytes:.0%} of budget"


def provenance(backend: str) -> str:
    """Whether a result's figures are simulated or measured, in words."""
    return "simulated" if backend == "simulate" else f"measured ({backend})"


def summarize(result: ProbeResult) -> str:
    config = " ".join(f"{k}={value(v)}" for k, v in result.config.items())
    lines = [
        f"{result.model} on {result.gpu} [{result.backend}]: {result.outcome.value}",
        f"  config     {config}",
    ]
    answered = (Outcome.OK, Outcome.OOM, Outcome.OOM_HOST)
    if result.outcome in answered and result.peak_bytes is not None:
        share = result.peak_bytes / result.budget_bytes
        if result.outcome is Outcome.OOM:
            verdict = f"does not fit; first over budget in {result.phase}"
        elif result.outcome is Outcome.OOM_HOST:
            verdict = "fits"
        else:
            verdict = f"fits; at its peak in {result.phase}"
        lines.append(
            f"  peak       {size(result.peak_bytes)} of a {size(result.budget_bytes)} budget "
            f"({share:.0%}): {verdict}"
        )
        host = host_line(result)
        if host:
            lines.append(f"  host       {host}")
        if result.breakdown:
            parts = " | ".join(
                f"{k.replace('_', ' ')} {size(v)}" for k, v in result.breakdown.items()
            )
            lines.append(f"  breakdown  {parts}")
        if result.samples_per_s is not None and result.step_time_s is not None:
            how = "roofline estimate" if result.throughput_estimated else "measured"
            tokens = f" ({result.tokens_per_s:,.0f} tokens/s)" if result.tokens_per_s else ""
            lines.append(
                f"  throughput {result.samples_per_s:.2f} samples/s{tokens}, {seconds(result.step_time_s)}/step "
                f"({how}); {flops(result.flops_per_sample)}/sample"
            )
        lines.append(
            f"  model      {count(result.param_count)} parameters, "
            f"{count(result.trainable_param_count)} trainable"
        )
    elif result.outcome is Outcome.OOM:
        lines.append(f"  out of memory in {result.phase or 'an unknown phase'}: {_message(result)}")
    else:
        lines.append(f"  {_message(result)}")
        tail = (result.error or {}).get("log_tail", "").strip().splitlines()[-LOG_LINES:]
        if tail:
            lines.append("  last lines of the worker's log:")
            lines.extend(f"    {line}" for line in tail)
    return "\n".join(lines)


def host_line(result: ProbeResult) -> str | None:
    """The host memory of a result in words, or None for a result from before autofit counted
    it."""
    if result.host_peak_bytes is None:
        return None
    peak = (
        f"{size(result.host_peak_bytes)} ({size(result.host_pinned_bytes or 0)} pinned, "
        f"{size(result.host_pageable_bytes or 0)} pageable)"
    )
    budget = result.host_budget_bytes
    if budget is None:
        return f"{peak}, at its peak in {result.host_phase}; host budget: {NOT_STATED}"
    share = result.host_peak_bytes / budget
    if result.outcome is Outcome.OOM_HOST:
        verdict = f"does not fit; first over budget in {result.phase}"
    else:
        verdict = f"fits; at its peak in {result.host_phase}"
    return f"{peak} of a {size(budget)} host budget ({share:.0%}): {verdict}"


def _message(result: ProbeResult) -> str:
    return (result.error or {}).get("message", "")
